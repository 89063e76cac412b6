//! What the decision records say was released: every record of the prolog, the epilog and
//! dispatch ([`ReleaseKind`], read from its spool key) names at most one job that left kace's
//! hold — where it went (a free GPU or an open one, beside whom), when, and how long it had been
//! held. `kace explain`, `kace metrics` and `kace report` all count releases from here.

use std::collections::BTreeMap;

use kace_sql::spool::ReleaseKind;
use kace_sql::NewDecision;
use serde::Serialize;

/// Where a released job went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Place {
    /// A GPU with no kace job: it leads there.
    FreeGpu,
    /// A GPU already running kace jobs: it joins them (a group is formed).
    OpenGpu,
    /// Wherever Slurm puts it: kace handed it back unpinned, asking for a whole GPU.
    Slurm,
}

impl Place {
    /// Its name in metrics labels.
    pub fn name(self) -> &'static str {
        match self {
            Place::FreeGpu => "free_gpu",
            Place::OpenGpu => "open_gpu",
            Place::Slurm => "slurm",
        }
    }
}

/// One release.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Released {
    /// Which record made it.
    #[serde(serialize_with = "kind_name")]
    pub kind: ReleaseKind,
    /// The released job.
    pub job: String,
    /// Where it went.
    pub place: Place,
    /// The first kace job on the GPU it joined (open GPUs only).
    pub beside: Option<String>,
    /// When, Unix seconds.
    pub at: f64,
    /// How long it had been held then, seconds (`None` in records from before it was kept).
    pub held_s: Option<f64>,
    /// Why it was handed back to Slurm (hand-backs only: the record's candidate's reason).
    pub why: Option<String>,
}

fn kind_name<S: serde::Serializer>(k: &ReleaseKind, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(k.name())
}

impl Released {
    /// What `by` label the release carries: `lead` for dispatch's lead releases, `partner` for a
    /// starting job's prolog's choice, otherwise the record's kind.
    pub fn by(&self) -> &'static str {
        match self.kind {
            ReleaseKind::LeadRelease => "lead",
            ReleaseKind::Lead => "partner",
            k => k.name(),
        }
    }
}

/// The release one decision record made, if any: its chosen job onto the lead's GPU, or, for
/// dispatch's releases onto a free GPU, its lead. A prolog's or epilog's decision that chose no
/// one released nothing (the lead's own release is dispatch's record).
pub fn released(d: &NewDecision, at: f64, key: Option<&str>) -> Option<Released> {
    let kind = ReleaseKind::of_key(key);
    let (job, place, beside) = match (&d.chosen_job, kind) {
        (Some(c), _) => (c.clone(), Place::OpenGpu, d.lead_job.clone()),
        (None, ReleaseKind::MaxHold | ReleaseKind::LeadRelease) => {
            (d.lead_job.clone()?, Place::FreeGpu, None)
        }
        (None, ReleaseKind::HandBack) => (d.lead_job.clone()?, Place::Slurm, None),
        (None, _) => return None,
    };
    let own = d.candidates.iter().find(|c| c.job.as_deref() == Some(&job));
    let held_s = own.and_then(|c| c.held_s);
    let why = own.filter(|_| kind == ReleaseKind::HandBack).and_then(|c| c.rejected.clone());
    Some(Released { kind, job, place, beside, at, held_s, why })
}

/// Releases counted by (`by` label, place), every combination that can occur listed (zero
/// when none occurred), in a fixed order.
pub fn count_by(releases: &[Released]) -> BTreeMap<(&'static str, &'static str), usize> {
    let mut out: BTreeMap<(&'static str, &'static str), usize> = [
        ("lead", Place::FreeGpu),
        ("partner", Place::OpenGpu),
        ("refill", Place::OpenGpu),
        ("late_arrival", Place::OpenGpu),
        ("max_hold", Place::FreeGpu),
        ("max_hold", Place::OpenGpu),
        ("hand_back", Place::Slurm),
    ]
    .into_iter()
    .map(|(by, p)| ((by, p.name()), 0))
    .collect();
    for r in releases {
        *out.entry((r.by(), r.place.name())).or_default() += 1;
    }
    out
}

/// Groups formed (releases onto an open GPU) by kind: lead (a prolog's choice), refill,
/// late_arrival, max_hold; every kind listed.
pub fn groups_by_kind(releases: &[Released]) -> BTreeMap<&'static str, usize> {
    let mut out: BTreeMap<&'static str, usize> =
        ["lead", "refill", "late_arrival", "max_hold"].into_iter().map(|k| (k, 0)).collect();
    for r in releases.iter().filter(|r| r.place == Place::OpenGpu) {
        *out.entry(r.kind.name()).or_default() += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use kace_sql::DecisionCandidate;

    fn rec(lead: &str, chosen: Option<&str>, held: &[(&str, f64)]) -> NewDecision {
        NewDecision {
            lead_job: Some(lead.into()),
            lead_workload: "a".into(),
            chosen_workload: chosen.map(|_| "b".into()),
            chosen_job: chosen.map(str::to_string),
            model_version: None,
            candidates: held
                .iter()
                .map(|(j, h)| DecisionCandidate {
                    job: Some(j.to_string()),
                    workload: "b".into(),
                    prediction: None,
                    rejected: None,
                    held_s: Some(*h),
                    priority: None,
                    time_limits: Vec::new(),
                    explores: Vec::new(),
                    thread_pct: None,
                })
                .collect(),
        }
    }

    #[test]
    fn each_kind_of_record_names_its_release() {
        let r = |d: &NewDecision, key: &str| released(d, 5.0, Some(key));
        // A prolog's choice: the partner joins the lead's GPU.
        let p = r(&rec("1", Some("2"), &[("2", 30.0), ("3", 40.0)]), "c/1/9/n1/decision").unwrap();
        assert_eq!(
            (p.kind, p.job.as_str(), p.place, p.beside.as_deref(), p.held_s, p.by()),
            (ReleaseKind::Lead, "2", Place::OpenGpu, Some("1"), Some(30.0), "partner")
        );
        // A prolog that chose no one released nothing.
        assert!(r(&rec("1", None, &[("3", 40.0)]), "c/1/9/n1/decision").is_none());
        // Dispatch: a late arrival, max_hold onto free and open GPUs, a lead release.
        let j = r(&rec("1", Some("4"), &[("4", 7.0)]), "c/4/9/n1/join").unwrap();
        assert_eq!(
            (j.kind, j.place, j.by()),
            (ReleaseKind::LateArrival, Place::OpenGpu, "late_arrival")
        );
        let m = r(&rec("5", None, &[("5", 600.0)]), "c/5/9/n1/max_hold").unwrap();
        assert_eq!((m.job.as_str(), m.place, m.held_s), ("5", Place::FreeGpu, Some(600.0)));
        let mo = r(&rec("1", Some("6"), &[("6", 601.0)]), "c/6/9/n1/max_hold").unwrap();
        assert_eq!(
            (mo.job.as_str(), mo.place, mo.beside.as_deref()),
            ("6", Place::OpenGpu, Some("1"))
        );
        let l = r(&rec("7", None, &[("7", 2.0)]), "c/7/9/n1/lead_release").unwrap();
        assert_eq!((l.by(), l.place), ("lead", Place::FreeGpu));
        // Records from before holds were kept.
        let mut old = rec("1", Some("2"), &[]);
        old.candidates.clear();
        assert_eq!(released(&old, 1.0, None).unwrap().held_s, None);

        let all = vec![p, j, m, mo, l];
        let by = count_by(&all);
        assert_eq!(by[&("partner", "open_gpu")], 1);
        assert_eq!(by[&("max_hold", "free_gpu")], 1);
        assert_eq!(by[&("max_hold", "open_gpu")], 1);
        assert_eq!(by[&("refill", "open_gpu")], 0);
        assert_eq!(by.values().sum::<usize>(), 5);
        let g = groups_by_kind(&all);
        assert_eq!((g["lead"], g["late_arrival"], g["max_hold"], g["refill"]), (1, 1, 1, 0));
    }
}

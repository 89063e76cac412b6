//! Slurm's GRES text, read by one parser wherever kace meets it: a job's request
//! (`tres-per-node`: `gres:shard:1` up to 23.02, `gres/shard:1` from 23.11), a running job's
//! allocation (`scontrol -d` / JSON `gres_detail`: `shard:g1:1(IDX:1)`, and from 23.11.2 the
//! shared form `shard:g1:1(0/2,1/2)`, one `alloc/avail` pair per GPU of the node), and a node's
//! configured GRES (`sinfo -O Gres`: `gpu:g0:1,shard:g0:2` or `gpu:2(S:0)`).
//!
//! Everything here is pure and total: text that does not parse yields no entry, never a panic.

/// One `name[:type]:count` entry of a request or a node's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GresSpec {
    /// `gpu`, `shard`, `mps`.
    pub name: String,
    /// The GPU type when given (`g1`).
    pub kind: Option<String>,
    /// How many (1 when the entry gives no count, as Slurm reads `--gres=shard`).
    pub count: u32,
}

/// One allocated GRES entry of a running job on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GresAlloc {
    /// `gpu`, `shard`, `mps`.
    pub name: String,
    /// The GPU type when the node's GPUs are typed (`g1`).
    pub kind: Option<String>,
    /// How many on this node.
    pub count: u32,
    /// Node-local indices of the GPUs it is on, ascending (empty when Slurm printed none).
    pub indices: Vec<u32>,
}

/// Splits a GRES list at the commas that are not inside parentheses (`gpu:2(IDX:0,1),shard:4`).
pub fn split_list(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth <= 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out.into_iter()
        .map(str::trim)
        .filter(|e| !e.is_empty() && *e != "(null)" && *e != "N/A")
        .collect()
}

/// One `name[:type][:count]` entry, the TRES prefix (`gres:` or `gres/`) and any `(…)` suffix
/// removed. A count that is not a number makes the entry unreadable.
fn spec(entry: &str) -> Option<GresSpec> {
    let entry = entry.split('(').next().unwrap_or("");
    let entry =
        entry.strip_prefix("gres/").or_else(|| entry.strip_prefix("gres:")).unwrap_or(entry);
    let parts: Vec<&str> = entry.split(':').collect();
    let (name, kind, count) = match parts.as_slice() {
        [n] => (*n, None, 1),
        // `shard:2` or `shard:g1` (a type with the count left out).
        [n, x] => match x.parse() {
            Ok(c) => (*n, None, c),
            Err(_) if is_word(x) => (*n, Some(x.to_string()), 1),
            Err(_) => return None,
        },
        [n, k, c] => (*n, Some(k.to_string()), c.parse().ok()?),
        _ => return None,
    };
    (is_word(name) && kind.as_deref().is_none_or(is_word)).then(|| GresSpec {
        name: name.to_string(),
        kind,
        count,
    })
}

fn is_word(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The entries of a GRES request or configuration (`gres/shard:g1:1,gres/gpu:1`).
pub fn parse_specs(s: &str) -> Vec<GresSpec> {
    split_list(s).into_iter().filter_map(spec).collect()
}

/// The count of `name` in a request like `gres/shard:2` or `gres:shard:g1:1`.
pub fn request_count(tres_per_node: &str, name: &str) -> Option<u32> {
    parse_specs(tres_per_node).into_iter().find(|g| g.name == name).map(|g| g.count)
}

/// The type a request pins `name` to (`gres/shard:g1:1` → `g1`), if any.
pub fn request_kind(tres_per_node: &str, name: &str) -> Option<String> {
    parse_specs(tres_per_node).into_iter().find(|g| g.name == name).and_then(|g| g.kind)
}

/// The allocation list of one node of a running job (`shard:g0:0(IDX:),shard:g1:1(IDX:1)`,
/// `shard:g1:1(0/2,1/2)`, `gpu(CNT:2)`).
pub fn parse_alloc(s: &str) -> Vec<GresAlloc> {
    split_list(s).into_iter().filter_map(alloc).collect()
}

fn alloc(entry: &str) -> Option<GresAlloc> {
    let (head, detail) = match entry.split_once('(') {
        Some((h, rest)) => (h, rest.strip_suffix(')')?),
        None => (entry, ""),
    };
    // `gpu(CNT:2)`: a count without indices.
    if let Some(n) = detail.strip_prefix("CNT:") {
        let g = spec(head)?;
        return Some(GresAlloc {
            name: g.name,
            kind: g.kind,
            count: n.parse().ok()?,
            indices: vec![],
        });
    }
    let g = spec(head)?;
    let indices = if let Some(list) = detail.strip_prefix("IDX:") {
        index_list(list)?
    } else if detail.contains('/') {
        // Shared GRES from 23.11.2: one `alloc/avail` pair per GPU of the node, in index order;
        // the job is on the GPUs whose alloc is not zero.
        let mut on = Vec::new();
        for (i, pair) in detail.split(',').enumerate() {
            let (a, _avail) = pair.split_once('/')?;
            if a.trim().parse::<u64>().ok()? > 0 {
                on.push(u32::try_from(i).ok()?);
            }
        }
        on
    } else if detail.is_empty() {
        vec![]
    } else {
        return None;
    };
    Some(GresAlloc { name: g.name, kind: g.kind, count: g.count, indices })
}

/// A Slurm bitmap list (`0`, `0-1`, `0,2-3`, or empty).
fn index_list(s: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty() && *p != "N/A") {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                if b < a || b - a > 1024 {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().ok()?),
        }
    }
    out.sort_unstable();
    out.dedup();
    Some(out)
}

/// The node-local indices of the GPUs a node's `GresUsed` shows any `gpu` or `shard` of in use,
/// whichever job holds them. `gpus` is the node's GPU types in index order ([`node_gpus`]).
/// Slurm 22.05 prints node-local indices (`shard:g1:1(IDX:1)`); from 23.11.2 a shared GRES
/// prints one `alloc/avail` pair per GPU *of its record* (`shard:g1:2(2/2)` on a node with one
/// g1 GPU: seen on 26.05.3, node/tests/fixtures), so a pair's position counts among the
/// node's GPUs of the entry's type (every GPU when untyped). A count without indices names no
/// GPU and is not counted.
pub fn busy_gpus(gres_used: &str, gpus: &[Option<String>]) -> Vec<u32> {
    let mut on = Vec::new();
    for entry in split_list(gres_used) {
        let Some(a) = alloc(entry) else { continue };
        if !matches!(a.name.as_str(), "gpu" | "shard") || a.count == 0 {
            continue;
        }
        let pairs =
            entry.split_once('(').is_some_and(|(_, d)| !d.starts_with("IDX:") && d.contains('/'));
        if !pairs {
            on.extend(a.indices);
            continue;
        }
        // Positions among the GPUs of the entry's type.
        let of_kind: Vec<u32> = (0u32..)
            .zip(gpus)
            .filter(|(_, k)| a.kind.is_none() || k.as_deref() == a.kind.as_deref())
            .map(|(i, _)| i)
            .collect();
        on.extend(a.indices.iter().filter_map(|&p| of_kind.get(p as usize).copied()));
    }
    on.sort_unstable();
    on.dedup();
    on
}

/// A node's GPU types in index order from its configured GRES (`gpu:g0:1,gpu:g1:1,…`), `None`
/// entries when untyped.
pub fn node_gpus(gres: &str) -> Vec<Option<String>> {
    parse_specs(gres)
        .into_iter()
        .filter(|g| g.name == "gpu")
        .flat_map(|g| (0..g.count.min(1024)).map(move |_| g.kind.clone()))
        .collect()
}

/// The shards each GPU of a node has, from its configured GRES (`gpu:g0:1,shard:g0:4,…` typed,
/// or `gpu:2,shard:8` shared out evenly): the fewest of any GPU type, 0 without GPUs or shards.
pub fn shards_per_gpu(gres: &str) -> u32 {
    let specs = parse_specs(gres);
    let count = |name: &str, kind: &Option<String>| -> u32 {
        specs.iter().filter(|g| g.name == name && g.kind == *kind).map(|g| g.count).sum()
    };
    let mut kinds: Vec<Option<String>> =
        specs.iter().filter(|g| g.name == "gpu").map(|g| g.kind.clone()).collect();
    kinds.sort();
    kinds.dedup();
    kinds
        .iter()
        .filter_map(|k| {
            let gpus = count("gpu", k);
            // Untyped shards on a node with typed GPUs are shared across all of them.
            let shards = match count("shard", k) {
                0 if k.is_some() => count("shard", &None) / kinds.len().max(1) as u32,
                n => n,
            };
            (gpus > 0).then(|| shards / gpus)
        })
        .min()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_gpus_by_index_and_by_alloc_pairs_of_a_type() {
        let typed = node_gpus("gpu:g0:1,gpu:g1:1,shard:g0:2,shard:g1:2");
        // 22.05: node-local indices.
        let used = "gpu:g0:0(IDX:N/A),gpu:g1:0(IDX:N/A),shard:g0:0(IDX:N/A),shard:g1:1(IDX:1)";
        assert_eq!(busy_gpus(used, &typed), vec![1]);
        // 26.05.3: one pair per GPU of the record's type.
        let used = "gpu:g0:0(IDX:N/A),gpu:g1:0(IDX:N/A),shard:g0:0(0/2),shard:g1:2(2/2)";
        assert_eq!(busy_gpus(used, &typed), vec![1]);
        assert_eq!(busy_gpus("shard:g0:1(1/2),shard:g1:0(0/2)", &typed), vec![0]);
        // Two GPUs of one type, and untyped GPUs: positions among them.
        let two = node_gpus("gpu:a:1,gpu:b:2,shard:a:2,shard:b:4");
        assert_eq!(two, vec![Some("a".into()), Some("b".into()), Some("b".into())]);
        assert_eq!(busy_gpus("shard:b:1(0/2,1/2),shard:a:0(0/2)", &two), vec![2]);
        let untyped = node_gpus("gpu:2,shard:4");
        assert_eq!(busy_gpus("gpu:0(IDX:N/A),shard:2(2/2,0/2)", &untyped), vec![0]);
        assert_eq!(busy_gpus("gpu:1(IDX:1),shard:0(IDX:N/A)", &untyped), vec![1]);
        // Nothing in use, unreadable, or a count with no index: no GPU.
        assert!(busy_gpus("(null)", &typed).is_empty());
        assert!(busy_gpus("gpu:g0:1", &typed).is_empty());
        assert!(busy_gpus("shard:g9:1(5/2)", &typed).is_empty());
    }

    #[test]
    fn shards_of_each_gpu() {
        assert_eq!(shards_per_gpu("gpu:g0:1,gpu:g1:1,shard:g0:4,shard:g1:4"), 4);
        assert_eq!(shards_per_gpu("gpu:g0:1(S:0),shard:g0:2(S:0)"), 2);
        assert_eq!(shards_per_gpu("gpu:2,shard:8"), 4);
        assert_eq!(shards_per_gpu("gpu:a100:2,shard:a100:4,gpu:h100:1,shard:h100:4"), 2);
        assert_eq!(shards_per_gpu("gpu:2"), 0);
        assert_eq!(shards_per_gpu("(null)"), 0);
    }

    #[test]
    fn requests_in_every_release_form() {
        // 22.05: `gres:`; 23.11 on: `gres/` (captured from 26.05.3 and 25.11.7).
        assert_eq!(request_count("gres:shard:3", "shard"), Some(3));
        assert_eq!(request_count("gres/shard:1", "shard"), Some(1));
        assert_eq!(request_count("gres:shard:g0:1", "shard"), Some(1));
        assert_eq!(request_count("gres/shard:g1:2", "shard"), Some(2));
        assert_eq!(request_count("gres/shard", "shard"), Some(1));
        assert_eq!(request_count("gres/gpu:1", "shard"), None);
        assert_eq!(request_count("gres/gpu:1,gres/shard:2", "shard"), Some(2));
        assert_eq!(request_count("", "shard"), None);
        assert_eq!(request_count("N/A", "shard"), None);
        assert_eq!(request_count("gres/shard:x:y", "shard"), None);
        assert_eq!(request_kind("gres/shard:g1:1", "shard").as_deref(), Some("g1"));
        assert_eq!(request_kind("gres:shard:g0:1", "shard").as_deref(), Some("g0"));
        assert_eq!(request_kind("gres/shard:1", "shard"), None);
    }

    #[test]
    fn allocations_with_indices_and_the_shared_form() {
        let a = parse_alloc("gpu:2(IDX:0-1),shard:1(IDX:3)");
        assert_eq!((a[0].indices.clone(), a[1].indices.clone()), (vec![0, 1], vec![3]));
        let a = parse_alloc("shard:g0:0(IDX:),shard:g1:1(IDX:1)");
        assert_eq!(a[0].indices, Vec::<u32>::new());
        assert_eq!(
            (a[1].kind.as_deref(), a[1].count, a[1].indices.clone()),
            (Some("g1"), 1, vec![1])
        );
        // 23.11.2 on (26.05.3 captures).
        let a = parse_alloc("shard:g1:1(0/2,1/2)");
        assert_eq!(
            (a[0].kind.as_deref(), a[0].count, a[0].indices.clone()),
            (Some("g1"), 1, vec![1])
        );
        let a = parse_alloc("shard:g0:1(1/2,0/2),shard:g1:0(0/2,0/2)");
        assert_eq!((a[0].indices.clone(), a[1].indices.clone()), (vec![0], vec![]));
        let a = parse_alloc("shard:1(1/4)");
        assert_eq!((a[0].kind.clone(), a[0].indices.clone()), (None, vec![0]));
        let a = parse_alloc("shard:2(1/2,1/2)");
        assert_eq!(a[0].indices, vec![0, 1]);
        let a = parse_alloc("gpu(CNT:2)");
        assert_eq!((a[0].count, a[0].indices.clone()), (2, vec![]));
        let a = parse_alloc("gpu:g0:0(IDX:),gpu:g1:1(IDX:1)");
        assert_eq!(a[1].indices, vec![1]);
        // Unreadable entries are dropped, not guessed at.
        assert!(parse_alloc("shard:1(x/2)").is_empty());
        assert!(parse_alloc("shard:1(IDX:9-1)").is_empty());
        assert!(parse_alloc("shard:1(IDX:0").is_empty());
    }

    #[test]
    fn node_configurations() {
        assert_eq!(
            node_gpus("gpu:g0:1,gpu:g1:1,shard:g0:2,shard:g1:2"),
            vec![Some("g0".to_string()), Some("g1".to_string())]
        );
        assert_eq!(node_gpus("gpu:2(S:0),shard:8"), vec![None, None]);
        assert!(node_gpus("(null)").is_empty());
    }
}

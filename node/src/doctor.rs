//! `kace doctor`: checks the kace setup of the host it runs on, as a node (plugin, Prolog and
//! Epilog, shard GRES, database, model, spool, MPS, NVML) or as the controller (gate and its
//! version, JobSubmitPlugins, EpilogSlurmctld, dispatch lock, shard GRES of every node), and says
//! for each check ok, warn or fail with the fix.
//!
//! It reads what Slurm really runs (`scontrol show config`, `scontrol -o show node`) rather than
//! slurm.conf, so an edit not yet applied by `scontrol reconfigure` shows as what it is. The
//! parsers and verdicts are pure functions of that text; [`run`] gathers it.

use std::collections::BTreeMap;
use std::fmt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use kace_config::Config;

use crate::exec::{self, Invocation};

/// The line in job_submit.lua that says which kace wrote the gate.
pub const GATE_VERSION_TAG: &str = "-- kace-gate-version:";

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    /// Set up as kace needs.
    Ok,
    /// Works, but less than it could, or a risk the admin should know of.
    Warn,
    /// kace cannot work (or cannot be removed safely) until this is fixed.
    Fail,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // pad, not write_str: tables align on `{:<5}`.
        f.pad(match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        })
    }
}

/// One check's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// How it came out.
    pub status: Status,
    /// What was checked (`plugstack`, `gate`, `database`, …).
    pub check: &'static str,
    /// What was found.
    pub detail: String,
    /// What to do about it (empty when ok).
    pub fix: String,
}

impl Finding {
    fn ok(check: &'static str, detail: impl Into<String>) -> Finding {
        Finding { status: Status::Ok, check, detail: detail.into(), fix: String::new() }
    }
    fn warn(check: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Finding {
        Finding { status: Status::Warn, check, detail: detail.into(), fix: fix.into() }
    }
    fn fail(check: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Finding {
        Finding { status: Status::Fail, check, detail: detail.into(), fix: fix.into() }
    }
}

/// The worst status among findings (`Ok` for none).
pub fn worst(findings: &[Finding]) -> Status {
    findings.iter().map(|f| f.status).max().unwrap_or(Status::Ok)
}

/// Which side of the cluster to check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A compute (and submit) node.
    Node,
    /// The Slurm controller.
    Controller,
    /// Both: a single-host cluster, or "everything this host can see".
    Both,
}

impl Role {
    fn node(self) -> bool {
        matches!(self, Role::Node | Role::Both)
    }
    fn controller(self) -> bool {
        matches!(self, Role::Controller | Role::Both)
    }
}

/// What [`run`] needs besides the configuration.
#[derive(Debug, Clone)]
pub struct Setup {
    /// Which checks.
    pub role: Role,
    /// This node's Slurm name (`NodeName`), for the node checks.
    pub node_name: String,
    /// The kace version the gate must carry (the CLI's own).
    pub kace_version: String,
}

/// `scontrol show config` as key → value (`PlugStackConfig` → `/etc/slurm/plugstack.conf`).
/// A list Slurm prints one entry a line (26.05: `Prolog[0] = …`, `Prolog[1] = …`; 22.05:
/// `Prolog = a,b`) is also given under its bare key, its entries joined by `,`
/// (src/api/config_info.c, `Prolog[%d]`); the numbered keys stay too (`SlurmctldHost[1]`).
pub fn parse_show_config(text: &str) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    for l in text.lines() {
        let Some((k, v)) = l.split_once(" = ") else { continue };
        let (k, v) = (k.trim(), v.trim());
        if k.is_empty() || k.contains(' ') {
            continue;
        }
        out.insert(k.to_string(), v.to_string());
        let numbered = k
            .strip_suffix(']')
            .and_then(|k| k.split_once('['))
            .filter(|(_, n)| n.parse::<u32>().is_ok());
        if let Some((base, _)) = numbered {
            let joined = out.entry(base.to_string()).or_default();
            if !joined.is_empty() {
                joined.push(',');
            }
            joined.push_str(v);
        }
    }
    out
}

/// The `Slurm a.b.c` version out of `scontrol --version` (`slurm 22.05.8`), as (major, minor).
pub fn parse_slurm_version(text: &str) -> Option<(u32, u32)> {
    let v = text.split_whitespace().nth(1)?;
    let mut it = v.split('.');
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// The kace plugin line of a plugstack file set: (file, `optional`/`required`, plugin path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlugstackLine {
    /// The file the line is in.
    pub file: PathBuf,
    /// `optional` or `required`.
    pub kind: String,
    /// The plugin's path.
    pub plugin: PathBuf,
}

/// Finds kace's line in `file` and the files it `include`s (one level of globs, as Slurm's
/// `include dir/*`).
fn find_plugstack_line(file: &Path) -> Result<Option<PlugstackLine>, String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    for line in text.lines() {
        let mut words = line.split_whitespace();
        match words.next() {
            Some(kind @ ("optional" | "required")) => {
                if let Some(p) = words.next().filter(|p| p.ends_with("libkace_spank.so")) {
                    return Ok(Some(PlugstackLine {
                        file: file.to_path_buf(),
                        kind: kind.to_string(),
                        plugin: PathBuf::from(p),
                    }));
                }
            }
            Some("include") => {
                for f in words.flat_map(expand_glob) {
                    if let Ok(Some(found)) = find_plugstack_line(&f) {
                        return Ok(Some(found));
                    }
                }
            }
            _ => {}
        }
    }
    Ok(None)
}

/// The files a `dir/pre*post` pattern names (a pattern without `*` names itself).
fn expand_glob(pattern: &str) -> Vec<PathBuf> {
    let p = Path::new(pattern);
    let Some(name) = p.file_name().and_then(|n| n.to_str()) else { return Vec::new() };
    let Some((pre, post)) = name.split_once('*') else { return vec![p.to_path_buf()] };
    let dir = p.parent().unwrap_or(Path::new("/"));
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|f| {
            f.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.len() >= pre.len() + post.len() && n.starts_with(pre) && n.ends_with(post)
            })
        })
        .collect();
    files.sort();
    files
}

/// The version a gate template carries (`-- kace-gate-version: 0.1.0`).
pub fn gate_version(lua: &str) -> Option<&str> {
    lua.lines().find_map(|l| l.trim().strip_prefix(GATE_VERSION_TAG)).map(str::trim)
}

/// The hold limit a gate promises its users (`local MAX_HOLD_S = 600`).
pub fn gate_max_hold(lua: &str) -> Option<u64> {
    lua.lines().find_map(|l| l.trim().strip_prefix("local MAX_HOLD_S =")?.trim().parse().ok())
}

/// Whether a `Prolog=`-style value runs `program`: it names it, or names a script or a glob
/// directory entry (`prolog.d/*`) that names or is it.
pub fn hook_runs(value: &str, program: &str) -> bool {
    value.split(',').map(str::trim).filter(|v| !v.is_empty() && *v != "(null)").any(|v| {
        expand_glob(v).iter().any(|f| {
            let resolved = std::fs::canonicalize(f).unwrap_or_else(|_| f.clone());
            resolved.file_name().is_some_and(|n| n == program)
                || f.file_name().is_some_and(|n| n == program)
                || script_mentions(f, program)
        })
    })
}

/// A small text script that names the program (a wrapper the site wrote).
fn script_mentions(file: &Path, program: &str) -> bool {
    match std::fs::read(file) {
        Ok(bytes) if bytes.len() <= 64 * 1024 && !bytes.starts_with(b"\x7fELF") => {
            String::from_utf8_lossy(&bytes).contains(program)
        }
        _ => false,
    }
}

/// The `Gres=` of a node from `scontrol -o show node NAME` (`gpu:1,shard:4`).
pub fn node_gres(show_node: &str) -> Option<String> {
    show_node.split_whitespace().find_map(|w| w.strip_prefix("Gres=")).map(without_parenthesised)
}

/// `gpu:g0:1(S:0),shard:g0:2(S:0)` without the socket notes: `gpu:g0:1,shard:g0:2`.
fn without_parenthesised(s: &str) -> String {
    let mut depth = 0u32;
    s.chars()
        .filter(|&c| {
            match c {
                '(' => depth += 1,
                ')' => depth = depth.saturating_sub(1),
                _ => return depth == 0,
            }
            false
        })
        .collect()
}

/// The verdict on one node's GRES: shards present, and typed when the node has several GPUs.
pub fn check_gres(node: &str, gres: &str) -> Finding {
    let entries = crate::gres::parse_specs(gres);
    let gpus: u32 = entries.iter().filter(|e| e.name == "gpu").map(|e| e.count).sum();
    let shards: Vec<&crate::gres::GresSpec> =
        entries.iter().filter(|e| e.name == "shard").collect();
    if shards.is_empty() {
        return Finding::fail(
            "shard gres",
            format!("node {node}: Gres={gres} has no shard"),
            "GresTypes=gpu,shard, and per node Gres=gpu:N,shard:M in slurm.conf with \
             Name=shard lines in gres.conf; then restart slurmctld and slurmd (GresTypes changes \
             need daemon restarts, not only scontrol reconfigure)",
        );
    }
    if gpus > 1 && shards.iter().any(|e| e.kind.is_none()) {
        return Finding::fail(
            "shard gres",
            format!("node {node}: {gpus} GPUs with untyped shards (Gres={gres})"),
            "type each GPU and its shards (Gres=gpu:g0:1,gpu:g1:1,shard:g0:2,shard:g1:2 and \
             Type= in gres.conf) so kace can put a partner on its lead's GPU; restart the daemons",
        );
    }
    Finding::ok("shard gres", format!("node {node}: Gres={gres}"))
}

/// Whether the decider stayed within `dispatch.rpc_budget_per_min` in the last full minute, as
/// its state file counts (`kace metrics` shows the same counts).
pub fn check_rpc_budget(config: &kace_config::Config, now: f64) -> Finding {
    const CHECK: &str = "decider rpcs";
    let budget = config.dispatch.rpc_budget_per_min;
    match crate::decider_state::DeciderState::peek(&config.dispatch.state_dir) {
        Ok(Some(s)) => match s.rpcs_last_minute(now) {
            Some(n) if n > budget => Finding::warn(
                CHECK,
                format!("{n} Slurm RPCs in the last minute, above dispatch.rpc_budget_per_min = {budget}"),
                "see kace metrics (kace_slurm_commands_total by kind): many kace jobs starting, \
                 or a Slurm command failing and retried",
            ),
            n => Finding::ok(
                CHECK,
                format!("{} Slurm RPCs in the last minute (budget {budget})", n.unwrap_or(0)),
            ),
        },
        Ok(None) => Finding::ok(CHECK, "no decider has run on this host yet".to_string()),
        Err(e) => Finding::warn(CHECK, e, "the decider rewrites its state after its next pass"),
    }
}

/// The uid of a `SlurmUser = slurm(64030)` value.
pub fn slurm_user_uid(value: &str) -> Option<u32> {
    value.split_once('(')?.1.strip_suffix(')')?.parse().ok()
}

/// Whether `uid` can open `lock` for writing (or create it): owner, or write bits for others
/// (group membership is not resolved: a group-writable lock is a warning, not a pass).
pub fn check_dispatch_lock(lock: &Path, user: &str, uid: u32) -> Finding {
    const CHECK: &str = "dispatch lock";
    if uid == 0 {
        return Finding::ok(CHECK, format!("{}: SlurmUser is root", lock.display()));
    }
    let fix = format!(
        "with SlurmUser {user}, EpilogSlurmctld's kace-dispatch must create or open {}: add \
         `f {} 0644 {uid} root -` to /etc/tmpfiles.d/kace-dispatch.conf and run \
         systemd-tmpfiles --create (the packaged /usr/lib/tmpfiles.d/kace.conf makes the \
         directory only)",
        lock.display(),
        lock.display()
    );
    let writable_by = |m: &std::fs::Metadata| m.uid() == uid || m.mode() & 0o002 != 0;
    match std::fs::metadata(lock) {
        Ok(m) if writable_by(&m) => {
            Finding::ok(CHECK, format!("{} is writable by SlurmUser {user}", lock.display()))
        }
        Ok(_) => Finding::fail(
            CHECK,
            format!("{} exists but SlurmUser {user} cannot write it", lock.display()),
            fix,
        ),
        Err(_) => match lock.parent().map(std::fs::metadata) {
            Some(Ok(m)) if writable_by(&m) => {
                Finding::ok(CHECK, format!("SlurmUser {user} can create {}", lock.display()))
            }
            _ => Finding::fail(
                CHECK,
                format!("SlurmUser {user} can neither open nor create {}", lock.display()),
                fix,
            ),
        },
    }
}

/// Whether root can create, write and remove a file in `dir` (what the prolog and epilog do
/// there). NFS with root_squash makes this fail for root while it works for users.
pub fn check_writable(check: &'static str, key: &str, dir: &Path) -> Finding {
    let probe = dir.join(format!(".kace-doctor-{}", std::process::id()));
    let result =
        std::fs::write(&probe, b"kace doctor\n").and_then(|()| std::fs::remove_file(&probe));
    match result {
        Ok(()) => Finding::ok(check, format!("{key} {} is writable", dir.display())),
        Err(e) => Finding::fail(
            check,
            format!("{key} {}: couldn't write a file: {e}", dir.display()),
            format!(
                "create {} (root-owned) on this node; on NFS export it without root_squash (or \
                 no_root_squash for this directory), since the prolog and epilog write as root",
                dir.display()
            ),
        ),
    }
}

/// Whether this node's prologs can believe the decider's release tickets
/// ([`kace_layout::release_ticket`]); without them each kace job's prolog asks slurmctld.
pub fn check_release_tickets(spool: &Path) -> Finding {
    let dir = spool.join(kace_layout::release_ticket::DIR);
    match kace_layout::release_ticket::dir_trusted(spool) {
        Ok(true) => Finding::ok("tickets", format!("{} is trusted", dir.display())),
        Ok(false) => Finding::ok(
            "tickets",
            format!("{} is not there yet (the decider creates it)", dir.display()),
        ),
        Err(e) => Finding::warn(
            "tickets",
            format!("the prologs will not believe the decider's release tickets: {e}"),
            format!(
                "chown root (or the owner of {}) {} and chmod 0750 it; until then each kace \
                 job's prolog reads its job from Slurm",
                spool.display(),
                dir.display()
            ),
        ),
    }
}

/// The `plugin_version` a SPANK plugin exports, read from its ELF dynamic symbol table (not by
/// loading it: Rust links with `-z now`, so the Slurm symbols it calls would have to resolve
/// here, and loading runs code as root for a check).
fn plugin_version(plugin: &Path) -> Result<u32, String> {
    let bytes = std::fs::read(plugin).map_err(|e| e.to_string())?;
    elf_u32_symbol(&bytes, "plugin_version")
        .ok_or_else(|| "it is not a 64-bit ELF object exporting plugin_version".to_string())
}

/// The 4-byte value of a defined dynamic symbol in a little-endian ELF64 object.
fn elf_u32_symbol(b: &[u8], name: &str) -> Option<u32> {
    // Every offset comes from the file: checked arithmetic, no panic on a hostile one.
    let bytes = |o: usize, n: usize| b.get(o..o.checked_add(n)?);
    let u16_at = |o: usize| Some(u16::from_le_bytes(bytes(o, 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(bytes(o, 4)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(bytes(o, 8)?.try_into().ok()?));
    // ELF magic, ELFCLASS64, ELFDATA2LSB.
    if b.get(0..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let shoff = usize::try_from(u64_at(0x28)?).ok()?;
    let shentsize = usize::from(u16_at(0x3a)?);
    let shnum = usize::from(u16_at(0x3c)?);
    // (type, link, addr, offset, size, entsize) of section i.
    let section = |i: usize| {
        let o = shoff.checked_add(i.checked_mul(shentsize)?)?;
        let field = |off: usize| o.checked_add(off);
        Some((
            u32_at(field(4)?)?,
            usize::try_from(u32_at(field(0x28)?)?).ok()?,
            u64_at(field(0x10)?)?,
            usize::try_from(u64_at(field(0x18)?)?).ok()?,
            usize::try_from(u64_at(field(0x20)?)?).ok()?,
            usize::try_from(u64_at(field(0x38)?)?).ok()?,
        ))
    };
    const SHT_DYNSYM: u32 = 11;
    let (_, strtab, _, symoff, symsize, entsize) =
        (0..shnum).filter_map(section).find(|s| s.0 == SHT_DYNSYM)?;
    let (_, _, _, stroff, strsize, _) = section(strtab)?;
    let names = b.get(stroff..stroff.checked_add(strsize)?)?;
    for i in 0..symsize / entsize.max(1) {
        let o = symoff.checked_add(i.checked_mul(entsize)?)?;
        let start = usize::try_from(u32_at(o)?).ok()?;
        let end = start + names.get(start..)?.iter().position(|&c| c == 0)?;
        let shndx = usize::from(u16_at(o.checked_add(6)?)?);
        if &names[start..end] != name.as_bytes() || shndx == 0 || shndx >= shnum {
            continue;
        }
        let value = u64_at(o.checked_add(8)?)?;
        let (_, _, addr, offset, _, _) = section(shndx)?;
        let at = offset.checked_add(usize::try_from(value.checked_sub(addr)?).ok()?)?;
        return u32_at(at);
    }
    None
}

/// Runs every check for `setup.role` and returns the findings in a fixed order.
pub fn run(config: &Config, setup: &Setup) -> Vec<Finding> {
    let timeout = Duration::from_millis(config.node.command_timeout_ms.max(5000));
    let scontrol = |args: &[&str]| -> Result<String, String> {
        let out = exec::run(&Invocation::new(&config.node.scontrol, args), timeout)
            .map_err(|e| e.to_string())?;
        if out.success() {
            Ok(out.stdout)
        } else {
            Err(format!(
                "{} {} exited with {:?}: {}",
                config.node.scontrol.display(),
                args.join(" "),
                out.code,
                out.stderr.trim()
            ))
        }
    };
    let mut out = Vec::new();
    let slurm = match scontrol(&["show", "config"]) {
        Ok(text) => parse_show_config(&text),
        Err(e) => {
            out.push(Finding::fail(
                "slurm",
                format!("couldn't read Slurm's configuration: {e}"),
                "node.scontrol in kace.conf must name scontrol, and slurmctld must answer",
            ));
            BTreeMap::new()
        }
    };
    let get = |k: &str| slurm.get(k).map(String::as_str).unwrap_or("");
    let local = scontrol(&["--version"]).ok().and_then(|v| parse_slurm_version(&v));

    if setup.role.node() {
        out.push(check_plugstack(get("PlugStackConfig"), local));
        out.push(check_hook("prolog", "Prolog", get("Prolog"), "kace-prolog"));
        out.push(check_hook("epilog", "Epilog", get("Epilog"), "kace-epilog"));
        out.push(if get("PrologFlags").split(',').any(|f| f.trim() == "Alloc") {
            Finding::ok("prolog flags", format!("PrologFlags={}", get("PrologFlags")))
        } else {
            Finding::fail(
                "prolog flags",
                format!("PrologFlags={} lacks Alloc", get("PrologFlags")),
                "PrologFlags=Alloc in slurm.conf (the partner is chosen while the lead is \
                 allocated, not at its first step); scontrol reconfigure",
            )
        });
        out.push(match scontrol(&["-o", "show", "node", &setup.node_name]) {
            Ok(text) => match node_gres(&text) {
                Some(g) => check_gres(&setup.node_name, &g),
                None => Finding::fail(
                    "shard gres",
                    format!("node {}: no Gres= in scontrol show node", setup.node_name),
                    "define shard GRES for this node",
                ),
            },
            Err(e) => Finding::fail(
                "shard gres",
                format!("couldn't read node {}: {e}", setup.node_name),
                "run on a compute node, or name it with --node-name",
            ),
        });
    }
    if setup.role.controller() {
        out.extend(check_controller(get, &setup.kace_version, config.dispatch.max_hold_s));
        out.push(match slurm_user_uid(get("SlurmUser")) {
            Some(uid) => check_dispatch_lock(&config.dispatch.lock, get("SlurmUser"), uid),
            None => Finding::warn(
                "dispatch lock",
                format!("couldn't read SlurmUser ({:?})", get("SlurmUser")),
                "check that SlurmUser can write dispatch.lock",
            ),
        });
        out.push(check_rpc_budget(config, crate::Clock::now(&crate::SystemClock)));
        out.push(match scontrol(&["-o", "show", "partition"]) {
            Ok(text) => check_billing(&text),
            Err(e) => Finding::warn(
                "billing",
                format!("couldn't read the partitions: {e}"),
                "run on the controller",
            ),
        });
    }
    out.extend(check_database(config, setup.role));
    if setup.role.node() {
        out.push(check_writable("spool", "spool.dir", &config.spool.dir));
        out.push(check_release_tickets(&config.spool.dir));
        out.push(check_writable("progress", "node.progress_root", &config.node.progress_root));
        out.push(check_mps(&config.node.mps_control));
        if config.mps.multi_user {
            out.push(check_mps_server_user(&config.mps.server_user));
        }
        out.push(check_device_numbering(get("TaskPlugin"), get("ConstrainDevices")));
        out.push(check_nvml(config.node.gpu_memory_gib));
    }
    out
}

/// A `TRESBillingWeights` value's weight for `tres` (`GRES/gpu`; untyped only, any case).
fn billing_weight(weights: &str, tres: &str) -> Option<f64> {
    weights.split(',').find_map(|w| {
        let (k, v) = w.split_once('=')?;
        // A weight may carry a unit suffix (`Mem=0.25G`); GRES weights do not.
        k.trim().eq_ignore_ascii_case(tres).then(|| v.trim().parse().ok()).flatten()
    })
}

/// kace's billing recommendation (admin guide §4.8): a kace job asks for shards, so where a
/// partition bills GPUs (`TRESBillingWeights` with `GRES/gpu`) it must bill shards too, or
/// kace jobs cost nothing there; `GRES/shard` = the GPU's weight / shards per GPU bills a
/// job its share of the GPU, alone or shared. `scontrol -o show partition` lines in.
pub fn check_billing(show_partition: &str) -> Finding {
    let mut unbilled = Vec::new();
    let mut billed = Vec::new();
    for line in show_partition.lines() {
        let fields: BTreeMap<&str, &str> =
            line.split_whitespace().filter_map(|w| w.split_once('=')).collect();
        let (Some(name), Some(weights)) =
            (fields.get("PartitionName"), fields.get("TRESBillingWeights"))
        else {
            continue;
        };
        let gpu = billing_weight(weights, "GRES/gpu");
        let shard = billing_weight(weights, "GRES/shard").filter(|w| *w > 0.0);
        match (gpu.filter(|g| *g > 0.0), shard) {
            (Some(g), None) => unbilled.push(format!("{name} (GRES/gpu={g})")),
            (_, Some(w)) => billed.push(format!("{name}: GRES/shard={w}")),
            (None, None) => {}
        }
    }
    if !unbilled.is_empty() {
        return Finding::warn(
            "billing",
            format!(
                "partition(s) {} bill GPUs but not shards: kace jobs bill no GPU there",
                unbilled.join(", ")
            ),
            "add GRES/shard=<GRES/gpu weight / shards per GPU> to their TRESBillingWeights \
             (admin guide §4.8); scontrol reconfigure",
        );
    }
    if billed.is_empty() {
        return Finding::ok(
            "billing",
            "no partition weights GPUs (TRESBillingWeights): sacct's AllocTRES shows each kace \
             job's gres/shard; kace records partners in AdminComment",
        );
    }
    Finding::ok("billing", format!("shards billed ({})", billed.join("; ")))
}

fn check_plugstack(plugstack: &str, local: Option<(u32, u32)>) -> Finding {
    const CHECK: &str = "plugstack";
    let file = if plugstack.is_empty() { "/etc/slurm/plugstack.conf" } else { plugstack };
    let line = match find_plugstack_line(Path::new(file)) {
        Ok(Some(l)) => l,
        Ok(None) => {
            return Finding::fail(
                CHECK,
                format!("{file} loads no libkace_spank.so"),
                "ln -s /usr/share/kace/kace-spank.conf /etc/slurm/plugstack.conf.d/kace.conf, \
                 with `include /etc/slurm/plugstack.conf.d/*` in plugstack.conf; restart slurmd",
            )
        }
        Err(e) => {
            return Finding::fail(CHECK, format!("couldn't read {e}"), "create plugstack.conf")
        }
    };
    let version = match plugin_version(&line.plugin) {
        Ok(v) => v,
        Err(e) => {
            return Finding::fail(
                CHECK,
                format!("couldn't load {}: {e}", line.plugin.display()),
                "install the kace package built for this Slurm series",
            )
        }
    };
    let built = ((version >> 16) & 0xff, (version >> 8) & 0xff);
    let shown = format!("{}.{:02}", built.0, built.1);
    if let Some(l) = local {
        if l != built {
            return Finding::fail(
                CHECK,
                format!(
                    "{} is built for Slurm {shown}, this node runs {}.{:02}",
                    line.plugin.display(),
                    l.0,
                    l.1
                ),
                "install the kace package built for this Slurm series (Slurm loads a SPANK \
                 plugin only for its own major.minor)",
            );
        }
    }
    let detail =
        format!("{}: {} {} (Slurm {shown})", line.file.display(), line.kind, line.plugin.display());
    if line.kind == "required" {
        return Finding::warn(
            CHECK,
            detail,
            "use `optional`: with `required`, a missing or stale plugin (a removed package, a \
             Slurm upgrade) makes every sbatch on this node fail",
        );
    }
    Finding::ok(CHECK, detail)
}

fn check_hook(check: &'static str, key: &str, value: &str, program: &str) -> Finding {
    if hook_runs(value, program) {
        Finding::ok(check, format!("{key}={value}"))
    } else {
        Finding::fail(
            check,
            format!(
                "{key}={} does not run {program}",
                if value.is_empty() { "(none)" } else { value }
            ),
            format!(
                "{key}=/usr/libexec/kace/{program} in slurm.conf (or a link to it in the site's \
                 {}.d/ directory); scontrol reconfigure",
                key.to_lowercase()
            ),
        )
    }
}

fn check_controller<'a>(
    get: impl Fn(&str) -> &'a str,
    kace_version: &str,
    max_hold_s: u64,
) -> Vec<Finding> {
    let mut out = Vec::new();
    let plugins = get("JobSubmitPlugins");
    if !plugins.split(',').any(|p| p.trim() == "lua" || p.trim() == "job_submit/lua") {
        out.push(Finding::fail(
            "job_submit",
            format!("JobSubmitPlugins={}", if plugins.is_empty() { "(none)" } else { plugins }),
            "JobSubmitPlugins=lua in slurm.conf; scontrol reconfigure",
        ));
    } else {
        let dirs = get("PluginDir");
        let found =
            dirs.split(':').map(|d| Path::new(d).join("job_submit_lua.so")).find(|p| p.exists());
        out.push(match found {
            Some(p) => Finding::ok("job_submit", format!("JobSubmitPlugins=lua, {}", p.display())),
            None => Finding::fail(
                "job_submit",
                format!("no job_submit_lua.so in PluginDir={dirs}"),
                "install Slurm's lua plugin (SchedMD's RPMs: rpmbuild --with lua; Debian: \
                 slurm-wlm-basic-plugins), then restart slurmctld",
            ),
        });
    }
    let gate = crate::slurm::slurm_conf_path(get("SLURM_CONF")).with_file_name("job_submit.lua");
    out.push(match std::fs::read_to_string(&gate) {
        Err(e) => Finding::fail(
            "gate",
            format!("couldn't read {}: {e}", gate.display()),
            format!("install -m 0644 /usr/share/kace/job_submit.lua {}", gate.display()),
        ),
        Ok(text) => match gate_version(&text) {
            Some(v) if v == kace_version => match gate_max_hold(&text) {
                Some(h) if h == max_hold_s => Finding::ok(
                    "gate",
                    format!("{}: kace {v}, users told max_hold {h} s", gate.display()),
                ),
                h => Finding::warn(
                    "gate",
                    format!(
                        "{}: tells users they wait at most {} s, dispatch.max_hold_s is {max_hold_s}",
                        gate.display(),
                        h.map_or("(no MAX_HOLD_S)".to_string(), |h| h.to_string())
                    ),
                    "set `local MAX_HOLD_S` in the gate to dispatch.max_hold_s",
                ),
            },
            Some(v) => Finding::fail(
                "gate",
                format!("{} is kace {v}'s gate, this is kace {kace_version}", gate.display()),
                "merge /usr/share/kace/job_submit.lua into the site's gate (its kace part and the \
                 version line)",
            ),
            None => Finding::fail(
                "gate",
                format!("{} has no `{GATE_VERSION_TAG}` line", gate.display()),
                "merge /usr/share/kace/job_submit.lua into the site's gate",
            ),
        },
    });
    out.push(check_hook(
        "epilog slurmctld",
        "EpilogSlurmctld",
        get("EpilogSlurmctld"),
        "kace-dispatch",
    ));
    // SlurmctldHost[1] is a backup controller: each controller's /run lock is its own, so two
    // dispatch timers would release jobs twice.
    if !get("SlurmctldHost[1]").is_empty() {
        out.push(Finding::warn(
            "controllers",
            format!("backup controller {}", get("SlurmctldHost[1]")),
            "enable kace-dispatch.timer on one controller only (EpilogSlurmctld runs only on the \
             active one), or guard the timer with ExecCondition= on `scontrol ping`",
        ));
    }
    out
}

fn check_database(config: &Config, role: Role) -> Vec<Finding> {
    let path = &config.database.path;
    let shared = if role.node() {
        "; database.path must be reachable (e.g. NFS) from every compute node, or prologs pair nothing"
    } else {
        ""
    };
    match kace_sql::Db::open_read_only(path) {
        Err(e) => {
            let fix = match e {
                kace_sql::Error::Missing { .. } | kace_sql::Error::NotInitialised { .. } => {
                    format!("kace db init on the database host{shared}")
                }
                kace_sql::Error::SchemaTooOld { .. } => "kace db migrate".to_string(),
                kace_sql::Error::SchemaTooNew { .. } => {
                    "install the kace version that wrote the database on this host".to_string()
                }
                _ => format!("kace db check on the database host{shared}"),
            };
            vec![Finding::fail("database", e.to_string(), fix)]
        }
        Ok(db) => {
            let schema = db.schema_version().unwrap_or(-1);
            let mut out =
                vec![Finding::ok("database", format!("{}: schema {schema}", path.display()))];
            out.push(match db.active_model_record() {
                Ok(Some(m)) => Finding::ok("model", format!("active model version {}", m.version)),
                Ok(None) => Finding::warn(
                    "model",
                    "no active model: prologs pair nothing",
                    "seed one: kace profile import + kace observations import (the KACE \
                     artifact's pairs or the site's own measured pairs), then kace train",
                ),
                Err(e) => Finding::fail("model", e.to_string(), "kace db check"),
            });
            out.extend(check_split_chooser(&db, config.mps.sm_split));
            out
        }
    }
}

/// With `mps.sm_split` on, whether the decider has a chooser to give joiners their share;
/// nothing to say when it is off.
pub fn check_split_chooser(db: &kace_sql::Db, sm_split: bool) -> Option<Finding> {
    if !sm_split {
        return None;
    }
    Some(match db.active_split_model() {
        Ok(Some(m)) => Finding::ok(
            "sm split",
            format!("joiners get SM shares from split chooser {}", m.version),
        ),
        Ok(None) => Finding::warn(
            "sm split",
            "mps.sm_split is on but no split chooser is active: joiners get no SM share",
            "kace splits train --sweeps share-sweeps.csv (bench/gpu/run measures it on a GPU), \
             or set mps.sm_split = false",
        ),
        Err(e) => Finding::fail("sm split", e.to_string(), "kace db check"),
    })
}

fn check_mps(program: &Path) -> Finding {
    match std::fs::metadata(program) {
        Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => {
            Finding::ok("mps", format!("{} is executable", program.display()))
        }
        Ok(_) => Finding::fail(
            "mps",
            format!("{} is not an executable file", program.display()),
            "node.mps_control in kace.conf must name nvidia-cuda-mps-control",
        ),
        Err(e) => Finding::fail(
            "mps",
            format!("{}: {e}", program.display()),
            "install the NVIDIA driver's nvidia-cuda-mps-control, or set node.mps_control",
        ),
    }
}

/// With `mps.multi_user`: whether `mps.server_user` is an account on this node (the prolog
/// refuses to start a shared server otherwise: its jobs run without MPS).
fn check_mps_server_user(user: &str) -> Finding {
    const CHECK: &str = "mps server user";
    match crate::mps::account_uid(user) {
        Some(0) => Finding::fail(CHECK, format!("{user:?} is root"), "give the server an account of its own"),
        Some(uid) => Finding::ok(
            CHECK,
            format!("shared MPS servers run as {user:?} (uid {uid}); no job may run as it"),
        ),
        None => Finding::fail(
            CHECK,
            format!("mps.server_user {user:?} is no account on this node"),
            "create it on every GPU node: useradd --system --no-create-home --shell /usr/sbin/nologin kace-mps",
        ),
    }
}

/// Whether a kace job's `CUDA_VISIBLE_DEVICES` names the device its MPS server has. kace starts
/// one MPS control daemon per GPU with `CUDA_VISIBLE_DEVICES=<host index>`, and the server then
/// shows that GPU to its clients as device 0 (NVIDIA: a client that keeps the host numbering gets
/// an error). Slurm numbers a job's devices from 0 only under `task/cgroup` with
/// `ConstrainDevices=yes` (`gres_use_local_device_index`); otherwise a kace job on any GPU but the
/// first names a device its server does not have.
pub fn check_device_numbering(task_plugin: &str, constrain_devices: &str) -> Finding {
    const CHECK: &str = "device numbering";
    let cgroup = task_plugin.split(',').any(|p| p.trim() == "task/cgroup");
    let constrained = constrain_devices.trim().eq_ignore_ascii_case("yes");
    if cgroup && constrained {
        Finding::ok(CHECK, "task/cgroup with ConstrainDevices=yes: jobs see their GPU as device 0")
    } else {
        Finding::warn(
            CHECK,
            format!(
                "TaskPlugin={task_plugin:?}, ConstrainDevices={constrain_devices:?}: jobs see host \
                 GPU numbers, so a kace job on a GPU other than the first names a device its MPS \
                 server does not have"
            ),
            "TaskPlugin=task/cgroup in slurm.conf and ConstrainDevices=yes in cgroup.conf",
        )
    }
}

fn check_nvml(fallback: Option<f64>) -> Finding {
    match kace_profiling::nvml::open_sampler(0).and_then(|mut s| s.total_memory_bytes()) {
        Ok(bytes) => Finding::ok(
            "nvml",
            format!("GPU 0 has {:.1} GiB", bytes as f64 / f64::from(1u32 << 30)),
        ),
        Err(e) => match fallback {
            Some(g) => Finding::warn(
                "nvml",
                format!("{e}; the memory filter uses node.gpu_memory_gib = {g}"),
                "install the NVIDIA driver (libnvidia-ml.so.1) on GPU nodes",
            ),
            None => Finding::warn(
                "nvml",
                format!("{e}; no node.gpu_memory_gib either: pairs are not filtered by memory"),
                "install the NVIDIA driver, or set node.gpu_memory_gib in kace.conf",
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbered_config_lists_are_read_under_their_key() {
        let c = parse_show_config(
            "Prolog[0]               = /etc/slurm/prolog.d/a\nProlog[1]               = /usr/libexec/kace/kace-prolog\nEpilog                  = /x/kace-epilog\nSlurmctldHost[0]        = c1\nSlurmctldHost[1]        = c2\n",
        );
        assert_eq!(c["Prolog"], "/etc/slurm/prolog.d/a,/usr/libexec/kace/kace-prolog");
        assert_eq!(c["Epilog"], "/x/kace-epilog");
        assert_eq!(c["SlurmctldHost[1]"], "c2");
    }

    #[test]
    fn partitions_that_bill_gpus_must_bill_shards() {
        let gpu_only = "PartitionName=gpu AllowGroups=ALL TRESBillingWeights=CPU=1.0,Mem=0.25G,GRES/gpu=4.0 State=UP\n\
                        PartitionName=cpu TRESBillingWeights=CPU=1.0\n";
        let f = check_billing(gpu_only);
        assert_eq!(f.status, Status::Warn, "{f:?}");
        assert!(f.detail.contains("gpu (GRES/gpu=4)") && !f.detail.contains("cpu"), "{f:?}");
        let both = "PartitionName=gpu TRESBillingWeights=CPU=1.0,gres/gpu=4.0,GRES/shard=1.0\n";
        let f = check_billing(both);
        assert_eq!(f.status, Status::Ok, "{f:?}");
        assert!(f.detail.contains("gpu: GRES/shard=1"), "{f:?}");
        let none = "PartitionName=debug Nodes=n1 State=UP\n";
        assert_eq!(check_billing(none).status, Status::Ok);
        assert!(check_billing(none).detail.contains("no partition weights GPUs"));
        // A zero shard weight bills nothing either.
        let zero = "PartitionName=gpu TRESBillingWeights=GRES/gpu=2,GRES/shard=0\n";
        assert_eq!(check_billing(zero).status, Status::Warn);
    }

    const SHOW_CONFIG: &str = "Configuration data as of 2026-12-01T01:00:00\n\
        AccountingStorageType   = accounting_storage/none\n\
        Epilog                  = /usr/libexec/kace/kace-epilog\n\
        JobSubmitPlugins        = lua\n\
        PrologFlags             = Alloc,Contain\n\
        SlurmUser               = slurm(64030)\n\
        SLURM_VERSION           = 22.05.8\n\
        \n\
        Cgroup Support Configuration:\n";

    #[test]
    fn show_config_parses_keys_and_values() {
        let m = parse_show_config(SHOW_CONFIG);
        assert_eq!(m["Epilog"], "/usr/libexec/kace/kace-epilog");
        assert_eq!(m["PrologFlags"], "Alloc,Contain");
        assert_eq!(m["SLURM_VERSION"], "22.05.8");
        assert_eq!(slurm_user_uid(&m["SlurmUser"]), Some(64030));
        assert_eq!(slurm_user_uid("root(0)"), Some(0));
        assert_eq!(slurm_user_uid("slurm"), None);
        assert_eq!(parse_slurm_version("slurm 22.05.8\n"), Some((22, 5)));
        assert_eq!(parse_slurm_version("slurm-wlm 26.05.3"), Some((26, 5)));
    }

    #[test]
    fn device_numbering_needs_task_cgroup_and_constrained_devices() {
        let status = |t, c| check_device_numbering(t, c).status;
        assert_eq!(status("task/affinity,task/cgroup", "yes"), Status::Ok);
        assert_eq!(status("task/cgroup", "no"), Status::Warn);
        assert_eq!(status("task/none", "yes"), Status::Warn);
        assert_eq!(status("task/affinity", ""), Status::Warn);
    }

    #[test]
    fn gate_version_line_is_found() {
        let lua = "--[[ x ]]\n-- kace-gate-version: 0.1.0\nlocal A = 1\n";
        assert_eq!(gate_version(lua), Some("0.1.0"));
        assert_eq!(gate_version("local A = 1\n"), None);
        // The packaged gate carries one, and it is this version.
        let packaged = include_str!("../../packaging/job_submit.lua");
        assert_eq!(gate_version(packaged), Some(env!("CARGO_PKG_VERSION")));
        assert_eq!(
            gate_max_hold(packaged),
            Some(kace_config::Config::default().dispatch.max_hold_s)
        );
    }

    #[test]
    fn gres_verdicts() {
        assert_eq!(check_gres("n1", "gpu:1,shard:4").status, Status::Ok);
        assert_eq!(check_gres("n1", "gpu:g0:1,gpu:g1:1,shard:g0:2,shard:g1:2").status, Status::Ok);
        let f = check_gres("n1", "gpu:2,shard:8");
        assert_eq!(f.status, Status::Fail);
        assert!(f.detail.contains("untyped"), "{}", f.detail);
        let f = check_gres("n1", "gpu:1");
        assert_eq!(f.status, Status::Fail);
        assert!(f.fix.contains("restart"), "{}", f.fix);
        assert_eq!(
            node_gres(
                "NodeName=n1 Arch=x86_64 Gres=gpu:g0:1(S:0),gpu:g1:1(S:1),shard:g0:2(S:0) X=1"
            )
            .as_deref(),
            Some("gpu:g0:1,gpu:g1:1,shard:g0:2")
        );
        assert_eq!(
            node_gres("NodeName=n1 Gres=gpu:1,shard:4 GresDrain=N/A").as_deref(),
            Some("gpu:1,shard:4")
        );
    }

    #[test]
    fn plugstack_follows_includes_and_hooks_follow_scripts() {
        let dir = std::env::temp_dir().join(format!("kace-doctor-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("plugstack.conf.d")).unwrap();
        let main = dir.join("plugstack.conf");
        std::fs::write(&main, format!("include {}/plugstack.conf.d/*.conf\n", dir.display()))
            .unwrap();
        std::fs::write(dir.join("plugstack.conf.d/other.conf"), "optional /x/other.so\n").unwrap();
        std::fs::write(
            dir.join("plugstack.conf.d/kace.conf"),
            "# c\noptional /usr/lib64/slurm/libkace_spank.so mps_root=/run/kace/mps\n",
        )
        .unwrap();
        let l = find_plugstack_line(&main).unwrap().unwrap();
        assert_eq!(l.kind, "optional");
        assert_eq!(l.plugin, Path::new("/usr/lib64/slurm/libkace_spank.so"));
        assert!(l.file.ends_with("kace.conf"));
        std::fs::remove_file(dir.join("plugstack.conf.d/kace.conf")).unwrap();
        assert_eq!(find_plugstack_line(&main).unwrap(), None);

        let wrapper = dir.join("prolog.sh");
        std::fs::write(&wrapper, "#!/bin/sh\nexec /usr/libexec/kace/kace-prolog\n").unwrap();
        assert!(hook_runs(&wrapper.display().to_string(), "kace-prolog"));
        assert!(!hook_runs(&wrapper.display().to_string(), "kace-epilog"));
        assert!(hook_runs("/usr/libexec/kace/kace-epilog", "kace-epilog"));
        assert!(!hook_runs("(null)", "kace-epilog"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn dispatch_lock_for_a_non_root_slurm_user() {
        let dir = std::env::temp_dir().join(format!("kace-doctor-lock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let lock = dir.join("dispatch.lock");
        assert_eq!(check_dispatch_lock(&lock, "root(0)", 0).status, Status::Ok);
        let owner = std::fs::metadata(&dir).unwrap().uid();
        let other = owner + 4242;
        let f = check_dispatch_lock(&lock, "slurm(x)", other);
        assert_eq!(f.status, Status::Fail, "{f:?}");
        assert!(f.fix.contains("tmpfiles.d"), "{}", f.fix);
        std::fs::write(&lock, "").unwrap();
        std::fs::set_permissions(&lock, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(check_dispatch_lock(&lock, "slurm(x)", other).status, Status::Ok);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_shared_servers_account_must_exist_and_not_be_root() {
        assert_eq!(check_mps_server_user("nobody").status, Status::Ok);
        assert_eq!(check_mps_server_user("root").status, Status::Fail);
        let f = check_mps_server_user("kace-no-such-account");
        assert_eq!(f.status, Status::Fail, "{f:?}");
        assert!(f.fix.contains("useradd --system"), "{}", f.fix);
    }

    #[test]
    fn plugin_version_needs_an_elf_object() {
        assert_eq!(elf_u32_symbol(b"#!/bin/sh\n", "plugin_version"), None);
        assert_eq!(elf_u32_symbol(b"\x7fELF\x02\x01", "plugin_version"), None);
        // A section table pointing past the end of the file (or past usize::MAX) is no symbol.
        let mut hostile = b"\x7fELF\x02\x01".to_vec();
        hostile.resize(0x40, 0xff);
        assert_eq!(elf_u32_symbol(&hostile, "plugin_version"), None);
        // This test binary is an ELF64 object whose dynamic symbols hold no plugin_version.
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert_eq!(elf_u32_symbol(&me, "plugin_version"), None);
        assert!(plugin_version(Path::new("/nonexistent/libkace_spank.so")).is_err());
    }

    #[test]
    fn release_tickets_are_believed_only_from_a_directory_nobody_else_writes() {
        use std::os::unix::fs::PermissionsExt;
        let spool =
            std::env::temp_dir().join(format!("kace-doctor-tickets-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&spool);
        std::fs::create_dir_all(&spool).unwrap();
        let f = check_release_tickets(&spool);
        assert_eq!(f.status, Status::Ok);
        assert!(f.detail.contains("not there yet"), "{f:?}");
        let dir = spool.join(kace_layout::release_ticket::DIR);
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o750)).unwrap();
        assert_eq!(check_release_tickets(&spool).status, Status::Ok);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let f = check_release_tickets(&spool);
        assert_eq!(f.status, Status::Warn, "{f:?}");
        assert!(f.detail.contains("writable by nobody else"), "{f:?}");
        std::fs::remove_dir_all(&spool).unwrap();
    }

    #[test]
    fn sm_split_on_without_a_chooser_is_a_warning() {
        let dir = std::env::temp_dir().join(format!("kace-doctor-split-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (mut db, _) = kace_sql::Db::create(&dir.join("kace.db")).unwrap();
        assert_eq!(check_split_chooser(&db, false), None);
        let f = check_split_chooser(&db, true).unwrap();
        assert_eq!(f.status, Status::Warn, "{f:?}");
        assert!(f.fix.contains("kace splits train"), "{f:?}");
        let model = kace_selector::splits::SplitModel {
            candidates: vec![kace_selector::dataset::ThreadSplit::DEFAULT],
            features: kace_selector::splits::FeatureSet::System,
            terms: vec![None],
            alpha: 1.0,
            margin: None,
            doubt_weight: 0.0,
        };
        let v = db.insert_split_model(&model, &serde_json::json!({})).unwrap();
        let f = check_split_chooser(&db, true).unwrap();
        assert_eq!(f.status, Status::Ok, "{f:?}");
        assert!(f.detail.contains(&format!("chooser {v}")), "{f:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn writable_dirs_and_worst() {
        let f = check_writable("spool", "spool.dir", Path::new("/nonexistent/kace"));
        assert_eq!(f.status, Status::Fail);
        assert!(f.fix.contains("root_squash"), "{}", f.fix);
        assert_eq!(check_writable("spool", "spool.dir", &std::env::temp_dir()).status, Status::Ok);
        assert_eq!(worst(&[]), Status::Ok);
        assert_eq!(worst(&[f.clone(), Finding::ok("x", "y")]), Status::Fail);
    }
}

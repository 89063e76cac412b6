//! kace-sampler: the node service (systemd, root) that reads every GPU into kace's rings
//! and caps running jobs' progress files. Thin: arguments, configuration, NVML, signals; the
//! loop is [`kace_sampler::service`].

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kace_profiling::nvml;
use kace_sampler::progress_cap::ProgressCap;
use kace_sampler::service::Service;

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

fn log(line: &str) {
    eprintln!("{line}");
}

fn main() -> ExitCode {
    let mut config_path: Option<PathBuf> = None;
    let mut once = false;
    let mut args = std::env::args_os().skip(1);
    while let Some(a) = args.next() {
        match a.to_str() {
            Some("--config") => match args.next() {
                Some(p) => config_path = Some(PathBuf::from(p)),
                None => return usage("--config needs a path"),
            },
            Some("--once") => once = true,
            Some("-h") | Some("--help") => {
                println!("usage: kace-sampler [--config PATH] [--once]");
                return ExitCode::SUCCESS;
            }
            _ => return usage(&format!("unknown argument {a:?}")),
        }
    }
    let config = match kace_config::Config::load(config_path.as_deref()) {
        Ok((c, _)) => c,
        Err(e) => {
            log(&format!("kace: sampler: {e}"));
            return ExitCode::from(2);
        }
    };
    let s = &config.sampler;
    // Without NVML there is nothing to read, but progress files are still capped.
    let count = match nvml::gpu_count() {
        Ok(n) => n,
        Err(e) => {
            log(&format!(
                "kace: sampler: couldn't read the GPUs: {e}; capping progress files only"
            ));
            0
        }
    };
    let mut samplers = Vec::new();
    for i in 0..count {
        match nvml::open_sampler(i) {
            Ok(sm) => samplers.push((i, sm)),
            Err(e) => log(&format!("kace: sampler: couldn't open GPU {i}: {e}")),
        }
    }
    if let Err(e) = std::fs::create_dir_all(&s.dir) {
        log(&format!("kace: sampler: couldn't create {}: {e}", s.dir.display()));
        return ExitCode::from(1);
    }
    let cap = ProgressCap::new(
        &config.node.progress_root,
        s.progress_max_bytes,
        config.profiling.warmup_steps,
    );
    let mut service = match Service::open(&s.dir, s.capacity, samplers) {
        Ok(svc) => svc.with_progress_cap(cap),
        Err(e) => {
            log(&format!("kace: sampler: couldn't open the rings: {e}"));
            return ExitCode::from(1);
        }
    };
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0)
    };
    if once {
        service.tick(now(), &log);
        return ExitCode::SUCCESS;
    }
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGTERM, on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t);
    }
    log(&format!(
        "kace: sampler: sampling {count} GPU(s) every {} ms into {}; capping progress files in {} at {} bytes",
        s.interval_ms,
        s.dir.display(),
        config.node.progress_root.display(),
        s.progress_max_bytes
    ));
    service.run(Duration::from_millis(s.interval_ms), &STOP, &now, &log);
    ExitCode::SUCCESS
}

fn usage(msg: &str) -> ExitCode {
    eprintln!("kace-sampler: {msg}\nusage: kace-sampler [--config PATH] [--once]");
    ExitCode::from(2)
}

//! Benchmark (prints a line) of what the epilog pays to read kace-sampler's ring: open the ring
//! of one GPU and take the readings of a job's run from it. The ring is full (a day at 1 Hz,
//! the default `sampler.capacity` of 86 400 readings, 4.0 MiB) and the job ran for the last
//! hour. Run with `cargo bench -p kace-sampler --bench ring_read`; the ring is built in the
//! system temp directory and removed at the end.

use std::time::{Duration, Instant};

use kace_sampler::{summarise, Reading, Ring};

const CAPACITY: u32 = 86_400;
const RUNS: usize = 51;

fn main() {
    let dir = std::env::temp_dir().join(format!("kace-ring-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("gpu0.ring");
    let mut ring = Ring::create(&path, CAPACITY).expect("ring");
    // One and a half days of readings: the ring has wrapped, as on a node that has run a while.
    let start = 1.7e9;
    for i in 0..(CAPACITY + CAPACITY / 2) {
        let t = start + f64::from(i);
        ring.push(&Reading {
            time: t,
            sm_pct: Some(f64::from(i % 100)),
            mem_pct: Some(f64::from(i % 50)),
            used_bytes: Some(u64::from(i % 64) << 30),
            energy_mj: Some(u64::from(i) * 200_000),
            power_w: Some(200.0),
        })
        .expect("push");
    }
    let end = start + f64::from(CAPACITY + CAPACITY / 2 - 1);
    let mut times: Vec<Duration> = Vec::with_capacity(RUNS);
    let mut samples = 0;
    for _ in 0..RUNS {
        let t = Instant::now();
        let r = Ring::open(&path).expect("open").readings(end - 3600.0, end).expect("read");
        samples = summarise(&r, 10).expect("summary").samples;
        times.push(t.elapsed());
    }
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "ring read + summary, {CAPACITY} slots, 1 h window ({samples} readings), {RUNS} runs: \
         median {:.2} ms, min {:.2} ms, p90 {:.2} ms, max {:.2} ms",
        ms(times[RUNS / 2]),
        ms(times[0]),
        ms(times[RUNS * 9 / 10]),
        ms(times[RUNS - 1])
    );
    let _ = std::fs::remove_dir_all(&dir);
}

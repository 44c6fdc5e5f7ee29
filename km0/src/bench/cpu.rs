//! Who used the CPUs during a measurement: the machine's busy time and each program's (by
//! process name: `postgres`, `java` for Kafka, `beam.smp` for RabbitMQ, `km0`), read from
//! `/proc` before and after, to tell what saturates first. Empty where `/proc` is missing.

use std::collections::BTreeMap;

/// CPU time so far, in clock ticks.
#[derive(Debug, Clone, Default)]
pub struct CpuTimes {
    /// Every CPU's busy ticks (user, nice, system, irq, softirq, steal), summed.
    busy: u64,
    /// Every CPU's ticks, busy or idle, summed.
    total: u64,
    /// Ticks of user and system time per process name.
    by_program: BTreeMap<String, u64>,
    /// CPUs on the machine.
    cpus: usize,
}

/// CPU use between two [`CpuTimes`], in percent of one CPU.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CpuUse {
    /// The whole machine: 100 × CPUs when every CPU was busy.
    pub machine: f64,
    /// CPUs on the machine.
    pub cpus: usize,
    /// Per process name, the busiest first.
    pub by_program: Vec<(String, f64)>,
}

/// Samples `/proc` on a thread of its own (off the measured runtime) until stopped: a
/// process that ends meanwhile (a database connection closed at the end of a run) still
/// counts for what it used up to its last sample.
#[derive(Debug)]
pub struct CpuSampler {
    stop: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<CpuTimes>,
}

/// Names for processes by pid, shared with a running [`CpuSampler`].
#[derive(Debug, Clone, Default)]
pub struct Labels(std::sync::Arc<std::sync::Mutex<std::collections::HashMap<u32, String>>>);

impl Labels {
    /// Counts process `pid` as `label`.
    pub fn add(&self, pid: u32, label: impl Into<String>) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(pid, label.into());
    }

    fn snapshot(&self) -> std::collections::HashMap<u32, String> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// How often the sampler reads `/proc`.
const SAMPLE_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

impl CpuSampler {
    /// Starts sampling now.
    pub fn start() -> Self {
        Self::start_labelled(Labels::default())
    }

    /// Starts sampling now, counting the processes `labels` names under their label instead
    /// of their program's name (one row per `km0` instance, say). A label can be added while
    /// sampling, for a process started since.
    pub fn start_labelled(labels: Labels) -> Self {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let start = machine();
            let mut last = processes();
            let mut used: BTreeMap<String, u64> = BTreeMap::new();
            loop {
                let done = !matches!(
                    stopped.recv_timeout(SAMPLE_EVERY),
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout)
                );
                let now = processes();
                let named = labels.snapshot();
                for (pid, (name, ticks)) in &now {
                    let name = named.get(pid).unwrap_or(name);
                    // A process first seen now started after the sampler: all of its time is
                    // the run's.
                    let before = last.get(pid).map_or(0, |(_, t)| *t);
                    *used.entry(name.clone()).or_default() += ticks.saturating_sub(before);
                }
                last = now;
                if done {
                    break;
                }
            }
            let end = machine();
            CpuTimes {
                busy: end.busy.saturating_sub(start.busy),
                total: end.total.saturating_sub(start.total),
                by_program: used,
                cpus: end.cpus,
            }
        });
        Self { stop, thread }
    }

    /// Stops sampling; what was used since [`start`](Self::start).
    pub async fn stop(self) -> CpuUse {
        let _ = self.stop.send(());
        let thread = self.thread;
        match tokio::task::spawn_blocking(move || thread.join()).await {
            Ok(Ok(spent)) => CpuTimes::default().until(&spent),
            _ => CpuUse::default(),
        }
    }
}

/// The machine's totals now.
fn machine() -> CpuTimes {
    let mut times = CpuTimes::default();
    if let Ok(stat) = std::fs::read_to_string("/proc/stat") {
        times.read_stat(&stat);
    }
    times
}

/// Every process's name and user + system ticks now, by pid.
fn processes() -> std::collections::HashMap<u32, (String, u64)> {
    let mut out = std::collections::HashMap::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            if let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) {
                if let Some(found) = process_ticks(&stat) {
                    out.insert(pid, found);
                }
            }
        }
    }
    out
}

impl CpuTimes {
    fn read_stat(&mut self, stat: &str) {
        for line in stat.lines() {
            let mut fields = line.split_whitespace();
            match fields.next() {
                Some("cpu") => {
                    let values: Vec<u64> = fields.filter_map(|f| f.parse().ok()).collect();
                    // user nice system idle iowait irq softirq steal (guest is within user).
                    let get = |i: usize| values.get(i).copied().unwrap_or(0);
                    self.busy = get(0) + get(1) + get(2) + get(5) + get(6) + get(7);
                    self.total = self.busy + get(3) + get(4);
                }
                Some(cpu) if cpu.starts_with("cpu") => self.cpus += 1,
                _ => {}
            }
        }
    }

    /// What was used from `self` to `later`, per process name by the totals each read.
    fn until(&self, later: &CpuTimes) -> CpuUse {
        let total = later.total.saturating_sub(self.total);
        if total == 0 {
            return CpuUse::default();
        }
        let cpus = later.cpus.max(1);
        // `total` ticks are spread over every CPU: one CPU's worth is total / cpus.
        let per_cpu = total as f64 / cpus as f64;
        let percent = |ticks: u64| 100.0 * ticks as f64 / per_cpu;
        let mut by_program: Vec<(String, f64)> = later
            .by_program
            .iter()
            .map(|(name, after)| {
                let before = self.by_program.get(name).copied().unwrap_or(0);
                (name.clone(), percent(after.saturating_sub(before)))
            })
            .filter(|(_, p)| *p >= 0.5)
            .collect();
        by_program.sort_by(|a, b| b.1.total_cmp(&a.1));
        CpuUse {
            machine: percent(later.busy.saturating_sub(self.busy)),
            cpus,
            by_program,
        }
    }
}

impl CpuUse {
    /// Percent of one CPU used by the programs whose name starts with `prefix`.
    pub fn of(&self, prefix: &str) -> f64 {
        self.by_program
            .iter()
            .filter(|(name, _)| name.starts_with(prefix))
            .map(|(_, p)| p)
            .sum()
    }
}

/// The process name and its user + system ticks, from `/proc/<pid>/stat`.
fn process_ticks(stat: &str) -> Option<(String, u64)> {
    // `pid (name) state ...`: the name may hold spaces and parentheses; it ends at the last ')'.
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat.get(open + 1..close)?.to_owned();
    let rest: Vec<&str> = stat.get(close + 1..)?.split_whitespace().collect();
    // After the name: state(0) ppid pgrp session tty tpgid flags minflt cminflt majflt
    // cmajflt utime(11) stime(12).
    let utime: u64 = rest.get(11)?.parse().ok()?;
    let stime: u64 = rest.get(12)?.parse().ok()?;
    Some((name, utime + stime))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_process_line_whose_name_has_spaces() {
        let line = "4242 (tokio (rt) 1) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0";
        assert_eq!(process_ticks(line), Some(("tokio (rt) 1".into(), 300)));
    }

    #[test]
    fn use_is_in_percent_of_one_cpu() {
        let mut before = CpuTimes::default();
        before.read_stat("cpu 100 0 100 800 0 0 0 0\ncpu0 1\ncpu1 1\n");
        before.by_program.insert("postgres".into(), 50);
        let mut after = CpuTimes::default();
        // 1000 ticks over 2 CPUs = 500 per CPU; 600 busy = 120 % of one CPU.
        after.read_stat("cpu 500 0 300 1200 0 0 0 0\ncpu0 1\ncpu1 1\n");
        after.by_program.insert("postgres".into(), 300);
        let used = before.until(&after);
        assert_eq!(used.cpus, 2);
        assert!((used.machine - 120.0).abs() < 1e-9, "{}", used.machine);
        assert!((used.of("postgres") - 50.0).abs() < 1e-9);
    }

    /// Keeps this thread's CPU busy for 400 ms.
    fn spin_for_a_while() {
        let spin = std::time::Instant::now();
        let mut x = 0u64;
        while spin.elapsed() < std::time::Duration::from_millis(400) {
            x = x.wrapping_mul(31).wrapping_add(7);
        }
        std::hint::black_box(x);
    }

    #[tokio::test]
    async fn a_labelled_process_is_counted_under_its_label() {
        if !std::path::Path::new("/proc/self/stat").exists() {
            return;
        }
        let labels = Labels::default();
        let sampler = CpuSampler::start_labelled(labels.clone());
        labels.add(std::process::id(), "this-test");
        spin_for_a_while();
        let used = sampler.stop().await;
        assert!(used.of("this-test") > 0.0, "{used:?}");
    }

    #[tokio::test]
    async fn the_sampler_sees_this_process_work() {
        if !std::path::Path::new("/proc/self/stat").exists() {
            return;
        }
        let sampler = CpuSampler::start();
        spin_for_a_while();
        let used = sampler.stop().await;
        assert!(used.cpus >= 1);
        assert!(used.machine > 0.0, "{used:?}");
        assert!(!used.by_program.is_empty(), "{used:?}");
    }
}

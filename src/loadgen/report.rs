//! Load-generator figures: one JSON line per measuring window, and a table for people that
//! takes every window of a mode together.

use std::time::Duration;

use hdrhistogram::Histogram;

use super::{LoadConfig, Mode};

#[derive(Debug, Clone)]
pub struct LoadResult {
    pub mode: Mode,
    pub connections: usize,
    pub callers: usize,
    /// Measuring windows taken together (1 for a single run of the mode).
    pub windows: usize,
    pub seconds: f64,
    pub requests: u64,
    pub errors: u64,
    pub throughput: f64,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    /// CPU time the server process used during the measuring windows, when the load generator
    /// can read it (a server it spawned, on Linux).
    pub server_cpu: Option<Duration>,
    histogram: Histogram<u64>,
}

impl LoadResult {
    pub(super) fn new(
        mode: Mode,
        config: &LoadConfig,
        histogram: Histogram<u64>,
        errors: u64,
        server_cpu: Option<Duration>,
    ) -> Self {
        let seconds = config.duration.as_secs_f64();
        Self::from_parts(mode, config.connections, config.callers, 1, seconds, histogram, errors, server_cpu)
    }

    #[allow(clippy::too_many_arguments)]
    fn from_parts(
        mode: Mode,
        connections: usize,
        callers: usize,
        windows: usize,
        seconds: f64,
        histogram: Histogram<u64>,
        errors: u64,
        server_cpu: Option<Duration>,
    ) -> Self {
        let requests = histogram.len();
        Self {
            mode,
            connections,
            callers,
            windows,
            seconds,
            requests,
            errors,
            throughput: requests as f64 / seconds,
            p50_us: histogram.value_at_quantile(0.50),
            p90_us: histogram.value_at_quantile(0.90),
            p99_us: histogram.value_at_quantile(0.99),
            p999_us: histogram.value_at_quantile(0.999),
            server_cpu,
            histogram,
        }
    }

    /// Several windows of one mode as one result: requests and seconds summed, latencies
    /// merged. `None` when `windows` is empty.
    pub fn combine(windows: &[&LoadResult]) -> Option<Self> {
        let first = windows.first()?;
        let mut histogram = first.histogram.clone();
        for w in &windows[1..] {
            histogram.add(&w.histogram).expect("histograms share their bounds");
        }
        let cpu = windows.iter().map(|w| w.server_cpu).sum::<Option<Duration>>();
        Some(Self::from_parts(
            first.mode,
            first.connections,
            first.callers,
            windows.iter().map(|w| w.windows).sum(),
            windows.iter().map(|w| w.seconds).sum(),
            histogram,
            windows.iter().map(|w| w.errors).sum(),
            cpu,
        ))
    }

    /// Server CPU time per answered request, in microseconds.
    pub fn server_cpu_us_per_request(&self) -> Option<f64> {
        let cpu = self.server_cpu?;
        (self.requests > 0).then(|| cpu.as_secs_f64() * 1e6 / self.requests as f64)
    }

    pub fn json(&self) -> String {
        let cpu = self.server_cpu_us_per_request().map_or_else(|| "null".to_owned(), |us| format!("{us:.2}"));
        format!(
            concat!(
                "{{\"mode\":\"{}\",\"connections\":{},\"callers\":{},\"windows\":{},\"seconds\":{:.1},",
                "\"requests\":{},\"errors\":{},\"throughput\":{:.0},\"p50_us\":{},\"p90_us\":{},\"p99_us\":{},",
                "\"p999_us\":{},\"server_cpu_us_per_request\":{}}}"
            ),
            self.mode.name(),
            self.connections,
            self.callers,
            self.windows,
            self.seconds,
            self.requests,
            self.errors,
            self.throughput,
            self.p50_us,
            self.p90_us,
            self.p99_us,
            self.p999_us,
            cpu
        )
    }
}

/// Each mode's windows taken together, in the order the modes first ran.
pub fn combine_by_mode(results: &[LoadResult]) -> Vec<LoadResult> {
    let mut modes: Vec<Mode> = Vec::new();
    for r in results {
        if !modes.contains(&r.mode) {
            modes.push(r.mode);
        }
    }
    modes.iter().filter_map(|mode| LoadResult::combine(&windows_of(results, *mode))).collect()
}

/// The windows of one mode taken together; `None` when there are none.
pub fn combine_windows(results: &[LoadResult]) -> Option<LoadResult> {
    LoadResult::combine(&results.iter().collect::<Vec<_>>())
}

fn windows_of(results: &[LoadResult], mode: Mode) -> Vec<&LoadResult> {
    results.iter().filter(|r| r.mode == mode).collect()
}

/// The ratio of `a` to `b` throughput in each round: the i-th window of `a` against the i-th
/// window of `b`.
pub fn ratios_per_round(results: &[LoadResult], a: Mode, b: Mode) -> Vec<f64> {
    let (a, b) = (windows_of(results, a), windows_of(results, b));
    a.iter().zip(&b).map(|(a, b)| a.throughput / b.throughput).collect()
}

/// Smallest, median and largest of `values` (`None` when empty).
pub fn spread(values: &[f64]) -> Option<(f64, f64, f64)> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let median = match sorted.len() {
        0 => return None,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    };
    Some((sorted[0], median, sorted[sorted.len() - 1]))
}

/// The table of every mode (windows of a mode combined) and the ratios between modes.
pub fn print_table(results: &[LoadResult]) {
    let combined = combine_by_mode(results);
    println!(
        "{:<10} {:>8} {:>12} {:>8} {:>9} {:>9} {:>9} {:>9} {:>12}",
        "mode", "windows", "req/s", "errors", "p50 µs", "p90 µs", "p99 µs", "p99.9 µs", "cpu µs/req"
    );
    for r in &combined {
        let cpu = r.server_cpu_us_per_request().map_or_else(|| "-".to_owned(), |us| format!("{us:.1}"));
        println!(
            "{:<10} {:>8} {:>12.0} {:>8} {:>9} {:>9} {:>9} {:>9} {:>12}",
            r.mode.name(),
            r.windows,
            r.throughput,
            r.errors,
            r.p50_us,
            r.p90_us,
            r.p99_us,
            r.p999_us,
            cpu
        );
    }
    let find = |mode| combined.iter().find(|r| r.mode == mode);
    if let (Some(pick), Some(health)) = (find(Mode::Pick), find(Mode::Health)) {
        let mut line = format!("Pick / baseline throughput: {:.3}", pick.throughput / health.throughput);
        let rounds = ratios_per_round(results, Mode::Pick, Mode::Health);
        if let Some((low, median, high)) = spread(&rounds).filter(|_| rounds.len() > 1) {
            line.push_str(&format!(
                " (all windows together; per round over {} rounds: min {low:.3}, median {median:.3}, max {high:.3})",
                rounds.len()
            ));
        }
        println!("{line}");
        if let (Some(p), Some(h)) = (pick.server_cpu_us_per_request(), health.server_cpu_us_per_request()) {
            println!("Server CPU per request, Pick / baseline: {:.3} ({p:.1} µs against {h:.1} µs)", p / h);
        }
    }
    for (mode, label) in [(Mode::Pick, "Pick"), (Mode::Health, "rota's health check")] {
        if let (Some(measured), Some(floor)) = (find(mode), find(Mode::Floor)) {
            let mut line = format!("{label} / floor throughput: {:.3}", measured.throughput / floor.throughput);
            let rounds = ratios_per_round(results, mode, Mode::Floor);
            if let Some((low, median, high)) = spread(&rounds).filter(|_| rounds.len() > 1) {
                line.push_str(&format!(" (per round: min {low:.3}, median {median:.3}, max {high:.3})"));
            }
            println!("{line}");
            if let (Some(m), Some(f)) = (measured.server_cpu_us_per_request(), floor.server_cpu_us_per_request()) {
                println!("Server CPU per request, {label} / floor: {:.3} ({m:.1} µs against {f:.1} µs)", m / f);
            }
        }
    }
    if let (Some(pipelined), Some(pick)) = (find(Mode::Pipelined), find(Mode::Pick)) {
        println!("PickStream (pipelined) / unary Pick throughput: {:.2}", pipelined.throughput / pick.throughput);
    }
    if let Some(pick) = find(Mode::Pick) {
        for leased in combined.iter().filter(|r| matches!(r.mode, Mode::Lease(_))) {
            println!("{} / unary Pick throughput: {:.2}", leased.mode.name(), leased.throughput / pick.throughput);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(mode: Mode, requests: u64, latency_us: u64, cpu_ms: u64) -> LoadResult {
        let mut histogram = super::super::new_histogram();
        histogram.record_n(latency_us, requests).unwrap();
        LoadResult::from_parts(mode, 2, 64, 1, 2.0, histogram, 1, Some(Duration::from_millis(cpu_ms)))
    }

    #[test]
    fn windows_of_a_mode_combine_into_one_figure() {
        let results = [
            window(Mode::Health, 1000, 100, 500),
            window(Mode::Pick, 900, 300, 450),
            window(Mode::Pick, 700, 300, 350),
            window(Mode::Health, 800, 200, 400),
        ];
        let combined = combine_by_mode(&results);
        assert_eq!(combined.iter().map(|r| r.mode).collect::<Vec<_>>(), [Mode::Health, Mode::Pick]);
        let health = &combined[0];
        assert_eq!((health.windows, health.requests, health.errors), (2, 1800, 2));
        assert_eq!(health.throughput, 1800.0 / 4.0);
        assert_eq!(health.server_cpu, Some(Duration::from_millis(900)));
        assert_eq!(health.server_cpu_us_per_request(), Some(500.0));
        // 1000 samples at 100 µs and 800 at 200 µs: the median is in the first group.
        assert_eq!(health.p50_us, 100);
        assert!(health.p99_us >= 200 && health.p99_us < 201, "{}", health.p99_us);
        let rounds = ratios_per_round(&results, Mode::Pick, Mode::Health);
        assert_eq!(rounds, [0.9, 0.875]);
    }

    #[test]
    fn unknown_server_cpu_stays_unknown_when_combined() {
        let mut a = window(Mode::Pick, 10, 5, 1);
        a.server_cpu = None;
        let b = window(Mode::Pick, 10, 5, 1);
        let combined = LoadResult::combine(&[&a, &b]).unwrap();
        assert_eq!(combined.server_cpu, None);
        assert!(combined.json().contains("\"server_cpu_us_per_request\":null"));
    }

    #[test]
    fn spread_gives_min_median_max() {
        assert_eq!(spread(&[]), None);
        assert_eq!(spread(&[0.9]), Some((0.9, 0.9, 0.9)));
        assert_eq!(spread(&[0.95, 0.85, 0.9]), Some((0.85, 0.9, 0.95)));
        assert_eq!(spread(&[1.0, 0.5, 0.75, 0.25]), Some((0.25, 0.625, 1.0)));
    }
}

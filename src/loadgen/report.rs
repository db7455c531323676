//! Load-generator figures: one JSON line per mode, and a table for people.

use hdrhistogram::Histogram;

use super::{LoadConfig, Mode};

#[derive(Debug, Clone)]
pub struct LoadResult {
    pub mode: Mode,
    pub connections: usize,
    pub callers: usize,
    pub seconds: f64,
    pub requests: u64,
    pub errors: u64,
    pub throughput: f64,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
}

impl LoadResult {
    pub(super) fn new(mode: Mode, config: &LoadConfig, histogram: &Histogram<u64>, errors: u64) -> Self {
        let seconds = config.duration.as_secs_f64();
        let requests = histogram.len();
        Self {
            mode,
            connections: config.connections,
            callers: config.callers,
            seconds,
            requests,
            errors,
            throughput: requests as f64 / seconds,
            p50_us: histogram.value_at_quantile(0.50),
            p90_us: histogram.value_at_quantile(0.90),
            p99_us: histogram.value_at_quantile(0.99),
            p999_us: histogram.value_at_quantile(0.999),
        }
    }

    pub fn json(&self) -> String {
        format!(
            concat!(
                "{{\"mode\":\"{}\",\"connections\":{},\"callers\":{},\"seconds\":{:.1},\"requests\":{},",
                "\"errors\":{},\"throughput\":{:.0},\"p50_us\":{},\"p90_us\":{},\"p99_us\":{},\"p999_us\":{}}}"
            ),
            self.mode.name(),
            self.connections,
            self.callers,
            self.seconds,
            self.requests,
            self.errors,
            self.throughput,
            self.p50_us,
            self.p90_us,
            self.p99_us,
            self.p999_us
        )
    }
}

pub fn print_table(results: &[LoadResult]) {
    println!(
        "{:<10} {:>12} {:>8} {:>9} {:>9} {:>9} {:>9}",
        "mode", "req/s", "errors", "p50 µs", "p90 µs", "p99 µs", "p99.9 µs"
    );
    for r in results {
        println!(
            "{:<10} {:>12.0} {:>8} {:>9} {:>9} {:>9} {:>9}",
            r.mode.name(),
            r.throughput,
            r.errors,
            r.p50_us,
            r.p90_us,
            r.p99_us,
            r.p999_us
        );
    }
    let find = |mode| results.iter().find(|r| r.mode == mode);
    if let (Some(pick), Some(health)) = (find(Mode::Pick), find(Mode::Health)) {
        println!("Pick / baseline throughput: {:.2}", pick.throughput / health.throughput);
    }
    if let (Some(pipelined), Some(pick)) = (find(Mode::Pipelined), find(Mode::Pick)) {
        println!("PickStream (pipelined) / unary Pick throughput: {:.2}", pipelined.throughput / pick.throughput);
    }
    if let Some(pick) = find(Mode::Pick) {
        for leased in results.iter().filter(|r| matches!(r.mode, Mode::Lease(_))) {
            println!("{} / unary Pick throughput: {:.2}", leased.mode.name(), leased.throughput / pick.throughput);
        }
    }
}

//! Benchmarks against the real local RabbitMQ and PostgreSQL:
//! `order-expiry bench lateness` and `order-expiry bench throughput`.
//! They are not tests: run them on a quiet machine and read the report.

pub mod lateness;
pub mod plot;
pub mod throughput;
pub mod world;

use clap::Subcommand;

/// `bench` subcommands.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Lateness of cancels: the ladder against one naive holding queue.
    Lateness(lateness::LatenessArgs),
    /// Throughput and footprint against bare lapin baselines.
    Throughput(throughput::ThroughputArgs),
}

/// Percentile of sorted values by nearest rank; 0 for none.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::percentile;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 99.9), 100.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }
}

//! Benchmarks: cold start, drain at scale, PDB-constrained drains, `aws-auth` under
//! concurrency and token signing — measured through the same fakes and built binaries the
//! end-to-end tests use, so every figure is a real run of the real code.
//!
//! Every figure is a median over several runs (or one run of many operations), and every
//! comparison (against a bare `lambda_runtime` binary, the latency lower bound, kubectl) is
//! measured in the same run on the same machine.

mod aws_auth;
mod cold_start;
pub mod drain;
pub mod launch_lookup;
pub mod load_balancer_wait;
pub mod notice_calls;
pub mod pdb_paced;
pub mod refresh;
pub mod refresh_memory;
pub mod spot;
pub mod sweep;
pub mod timeline;
pub mod volume_wait;

use std::time::Duration;

pub use aws_auth::{AwsAuthFigures, aws_auth_concurrency};
pub use cold_start::{ColdStartRow, cold_start, token_signing};
pub use drain::{
    DefaultDrainFigures, DrainFigures, PdbFigures, drain_at_scale, drain_with_default_timings,
    pdb_constrained_drain,
};
pub use load_balancer_wait::{LoadBalancerWaitRow, load_balancer_wait};
pub use notice_calls::{EventCost, NoticeCalls, notice_calls};
pub use pdb_paced::{MassFigures, PacedFigures, mass_scale_in, mass_throttle, pdb_paced_drain};
pub use refresh::{RefreshRow, SettleCase, SettleRow, instance_refresh, refresh_with_waits};
pub use spot::{SpotFigures, spot_interruption};
pub use sweep::{SweepRow, sweep_at_scale};
pub use volume_wait::{VolumeWaitRow, volume_wait};

/// How much to run: `quick` keeps CI fast (it only proves the suite still works), `full`
/// produces the figures in `BENCHMARKS.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Quick,
    Full,
}

/// The median of `values` (the lower middle for an even count); zero when empty.
pub fn median(values: &mut [Duration]) -> Duration {
    if values.is_empty() {
        return Duration::ZERO;
    }
    values.sort();
    values[(values.len() - 1) / 2]
}

/// Milliseconds with one decimal, for tables.
pub fn ms(duration: Duration) -> String {
    format!("{:.1}", duration.as_secs_f64() * 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_is_the_middle_value() {
        let mut odd = [3, 1, 2].map(Duration::from_millis);
        assert_eq!(median(&mut odd), Duration::from_millis(2));
        let mut even = [4, 1, 3, 2].map(Duration::from_millis);
        assert_eq!(median(&mut even), Duration::from_millis(2));
        assert_eq!(median(&mut []), Duration::ZERO);
    }
}

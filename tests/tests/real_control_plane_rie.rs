//! Every function, built as released, run under AWS's own Lambda Runtime Interface Emulator
//! (`aws-lambda-rie`, the runtime API of AWS's Lambda base images, with the function timeout
//! set) instead of the kit's runtime API, in the real-plane scenarios that exercise it: the
//! deadline header, the response and error reporting, init and the timeout are AWS's.
//! This binary's worlds all run under the emulator (`run_functions_under_lambda_rie`): keep
//! other tests out of it.
#![allow(clippy::unwrap_used)]

use node_manager_testkit::control_plane::binaries_or_skip;
use node_manager_testkit::control_plane::scenarios::RealScenario;
use node_manager_testkit::control_plane::world::run_functions_under_lambda_rie;

/// nodegroup-auth (`nodegroup-auth`), the terminating hook (`drain`), the launching hook
/// (`warm-pool`), node repair (`repair`), instance-refresh (`refresh`): each scenario's
/// expectations must hold with the functions under the emulator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_function_holds_its_scenario_under_aws_lambda_rie_on_a_real_cluster() {
    let Some(bin) = binaries_or_skip(
        "every_function_holds_its_scenario_under_aws_lambda_rie_on_a_real_cluster",
    ) else {
        return;
    };
    if let Err(error) = node_manager_testkit::lambda_rie::rie_binary() {
        panic!("{error}");
    }
    run_functions_under_lambda_rie();
    let mut failed = Vec::new();
    for scenario in [
        RealScenario::NodegroupAuth,
        RealScenario::Drain,
        RealScenario::WarmPool,
        RealScenario::Repair,
        RealScenario::Refresh,
    ] {
        match scenario.play(&bin).await {
            Ok(played) => {
                let held = std::panic::AssertUnwindSafe(|| played.assert_held(scenario.name()));
                if let Err(why) = std::panic::catch_unwind(held) {
                    failed.push(format!("{}: {why:?}", scenario.name()));
                }
            }
            Err(error) => failed.push(format!("{}: {error}", scenario.name())),
        }
    }
    assert!(
        failed.is_empty(),
        "under aws-lambda-rie:\n{}",
        failed.join("\n")
    );
}

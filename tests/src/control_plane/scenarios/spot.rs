//! A Spot interruption: the warning (two minutes ahead) drains the node within its two
//! minutes on the wall clock, the pods' 300 s grace periods cut to fit and honoured by the
//! kubelets (each pod stays `Terminating` until its cut grace period has passed); the
//! terminating hook's notification that follows does not drain again and completes the
//! lifecycle action once.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use super::nginx::{AvailabilityWatch, seed_nginx};
use super::{Played, QUICK_DRAIN, next_notification, response, response_within};
use crate::aws::SpotInterruptionAction;
use crate::control_plane::ControlPlaneError;
use crate::control_plane::workload::accepted_evictions;
use crate::control_plane::world::RealFunctionWorld;
use crate::e2e::Target;
use crate::kube::AuditEvent;

/// The pods' grace period, longer than the warning leaves.
const GRACE_SECONDS: i64 = 300;
/// The terminating hook's timeout in the template.
const FUNCTION_TIMEOUT: Duration = Duration::from_secs(900);

pub async fn play(bin: &Path) -> Result<Played, ControlPlaneError> {
    let w = RealFunctionWorld::builder()
        .functions(&[Target::TerminatingHook])
        .spot()
        .envs(&QUICK_DRAIN)
        .env("DRAIN_LEASE_SECONDS", "2")
        .start(bin)
        .await?;
    let admin = w.plane.admin_client().await?;
    let seeded = seed_nginx(&w, &admin, GRACE_SECONDS).await?;
    let mut played = Played::on(&w);
    played.line(format!(
        "{} pods with a {GRACE_SECONDS} s grace period on {}",
        seeded.len(),
        w.node
    ));
    let watch = AvailabilityWatch::start(admin.clone());
    let mut topic = w.aws.sns().subscribe(&w.topic).map_err(setup)?;
    let interruption = w
        .aws
        .interruptions()
        .spot_interruption_carried_out(
            &w.instance,
            SpotInterruptionAction::Terminate,
            Duration::from_secs(120),
        )
        .map_err(setup)?;
    let notification = next_notification(&mut topic).await?;
    let hook = w.function(Target::TerminatingHook);
    played.line(format!("Spot interruption warning for {}", w.instance));
    let warned = Instant::now();
    // The template's timeout for the function: the drain waits out the cut grace periods.
    let answer = response_within(hook, &interruption.warning, FUNCTION_TIMEOUT).await?;
    let took = warned.elapsed();
    played.expect(
        "the warning drained the node",
        answer["instances"][0]["outcome"] == "Drained",
        &answer,
    );
    played.expect(
        "within the warning's two minutes on the wall clock",
        took < Duration::from_secs(120),
        format!("{took:?}"),
    );
    played.line("the terminating hook's notification");
    let answer = response(hook, &notification).await?;
    played.expect(
        "the notification completed the action without draining again",
        answer["records"][0]["outcome"] == "Completed",
        &answer,
    );
    watch.expect_budget_held(&mut played);
    let completions = w.aws.autoscaling().completions();
    played.expect(
        "the lifecycle action completed once",
        completions.len() == 1,
        format!("{completions:?}"),
    );
    expect_evicted_once_within_the_warning(&mut played, &w.plane.audit(), &seeded);
    Ok(played)
}

/// Every seeded pod evicted once, asking for a grace period the warning's two minutes hold
/// (1 to 115 s).
fn expect_evicted_once_within_the_warning(
    played: &mut Played,
    audit: &[AuditEvent],
    seeded: &BTreeSet<String>,
) {
    let user = RealFunctionWorld::username(Target::TerminatingHook);
    let mut graces: BTreeMap<String, Vec<Option<i64>>> = BTreeMap::new();
    for eviction in accepted_evictions(audit, user) {
        let grace = eviction
            .request_object
            .as_ref()
            .and_then(|b| b["deleteOptions"]["gracePeriodSeconds"].as_i64());
        graces
            .entry(eviction.name().to_owned())
            .or_default()
            .push(grace);
    }
    played.expect(
        "every pod of the node evicted",
        graces.keys().eq(seeded.iter()),
        format!("evicted {graces:?}, seeded {seeded:?}"),
    );
    played.expect(
        "each evicted once, its grace period cut to 1-115 s",
        graces
            .values()
            .all(|g| g.len() == 1 && (1..=115).contains(&g[0].unwrap_or_default())),
        format!("grace periods asked per pod: {graces:?}"),
    );
}

fn setup(error: impl std::fmt::Display) -> ControlPlaneError {
    ControlPlaneError::setup("the Spot scenario", error)
}

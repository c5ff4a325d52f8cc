//! How far the outdated nodes can be taken out of service now (pure): only as far as the
//! room that the refresh does not replace can take their pods.
//!
//! - **Room** is the free capacity of every node that accepts new pods (Ready, not
//!   cordoned, no `NoSchedule`/`NoExecute` taint) and that no refresh replaces: the
//!   refresh's own replacements, and nodes of other groups (not those another group's
//!   refresh marked outdated: they go too). A node's free capacity is
//!   its allocatable minus the requests of the pods bound to it, in CPU, memory and pods.
//! - **Pods to move** are a node's pods that its drain would move elsewhere (not a
//!   DaemonSet's, not mirror pods, not finished, not being deleted), with their requests.
//! - Outdated nodes already out of service (marked, being drained, or cordoned by someone)
//!   claim room first, and stay marked: the rule never lifts a mark to plan again. (The
//!   caller passes the nodes of the group's leaving instances, and those another group's
//!   refresh took out of service, the same way: their pods move too, and their nodes are
//!   no room.) When their pods do not all fit, the ones short of room will land on the
//!   outdated nodes still in service, so none of those is marked, not even an empty one (a
//!   refresh that started later would otherwise cordon the empty node another group's
//!   leaving pods were counted on).
//! - Then the other outdated nodes, oldest launch first (then fewest pods to move, then
//!   instance id): each is marked when every one of its pods can be placed, largest first,
//!   on a room node where it fits (first fit), on top of the pods placed before. Its pods
//!   then hold that room; a node whose pods do not fit stays schedulable, and the next ones
//!   are still tried. Oldest first is a stable order (launch times do not change between
//!   plans, pod counts do), and the likeliest guess of Auto Scaling's own order (the
//!   `OldestInstance` termination policy; the default one picks among instances of the same
//!   old template nearly at random): a marked node drained early protects its pods from a
//!   second move, one drained late only holds room.
//!
//! The placement is an actual assignment of every marked node's pods to room nodes within
//! their capacity, so the rule never counts room that is not there. It counts requests
//! only: node selectors, affinity, topology spread and tolerations are not modelled, so a
//! pod that can only run on some nodes may find the room elsewhere than it could go.

use serde::Serialize;

use super::capacity::Resources;

/// An outdated node as the rule sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutdatedNode {
    pub instance_id: String,
    /// When EC2 launched it (unknown: after every known one).
    pub launched: Option<jiff::Timestamp>,
    /// Cordoned already (by this refresh, a drain, or anyone).
    pub out_of_service: bool,
    /// The requests of the pods its drain would move.
    pub pods_to_move: Vec<Resources>,
}

/// What the rule decided.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RoomDecision {
    /// Instances to take out of service (or keep out of service).
    pub mark: Vec<String>,
    /// Outdated instances left schedulable: no room for their pods yet.
    pub kept: Vec<String>,
}

/// Which of `outdated` to mark, with `room` the free capacity of each room node.
pub fn choose(mut room: Vec<Resources>, outdated: &[OutdatedNode]) -> RoomDecision {
    let mut decision = RoomDecision::default();
    let mut short = false;
    for node in outdated.iter().filter(|n| n.out_of_service) {
        // Already out: its pods need the room whatever comes; what does not fit is short.
        short |= !place_all(&mut room, &node.pods_to_move);
        decision.mark.push(node.instance_id.clone());
    }
    let mut candidates: Vec<&OutdatedNode> =
        outdated.iter().filter(|n| !n.out_of_service).collect();
    candidates.sort_by_key(|n| {
        (
            n.launched.is_none(),
            n.launched,
            n.pods_to_move.len(),
            n.instance_id.clone(),
        )
    });
    for node in candidates {
        let mut tentative = room.clone();
        // Pods short of room go where the outdated nodes still in service have it: none of
        // them is taken out of service then, not even an empty one.
        if !short && place_all(&mut tentative, &node.pods_to_move) {
            room = tentative;
            decision.mark.push(node.instance_id.clone());
        } else {
            decision.kept.push(node.instance_id.clone());
        }
    }
    decision
}

/// Places `pods`, largest first, each on the first room node it fits, taking the room it
/// uses; whether every pod found a place (room is taken for the ones that did).
fn place_all(room: &mut [Resources], pods: &[Resources]) -> bool {
    let mut largest_first = pods.to_vec();
    largest_first.sort_unstable_by(|a, b| b.cmp(a));
    let mut all = true;
    for pod in &largest_first {
        match room.iter_mut().find(|free| pod.fits_in(free)) {
            Some(free) => *free = free.minus(pod),
            None => all = false,
        }
    }
    all
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn pod(cpu_millis: u64) -> Resources {
        Resources {
            cpu_millis,
            memory_bytes: 1 << 28,
            pods: 1,
        }
    }

    fn node_room(cpu_millis: u64, pods: u64) -> Resources {
        Resources {
            cpu_millis,
            memory_bytes: 16 << 30,
            pods,
        }
    }

    fn outdated(id: &str, pods: &[u64]) -> OutdatedNode {
        OutdatedNode {
            instance_id: id.to_owned(),
            launched: None,
            out_of_service: false,
            pods_to_move: pods.iter().map(|cpu| pod(*cpu)).collect(),
        }
    }

    fn three_old() -> Vec<OutdatedNode> {
        vec![
            outdated("i-1", &[500, 500]),
            outdated("i-2", &[500, 500]),
            outdated("i-3", &[500, 500]),
        ]
    }

    #[test]
    fn no_room_marks_nothing() {
        let decision = choose(Vec::new(), &three_old());
        assert!(decision.mark.is_empty());
        assert_eq!(decision.kept, vec!["i-1", "i-2", "i-3"]);
    }

    #[test]
    fn room_for_exactly_one_nodes_pods_marks_one() {
        let decision = choose(vec![node_room(1000, 110)], &three_old());
        assert_eq!(decision.mark, vec!["i-1"]);
        assert_eq!(decision.kept, vec!["i-2", "i-3"]);
        // The pod count limits as well as CPU.
        let decision = choose(vec![node_room(4000, 3)], &three_old());
        assert_eq!(decision.mark, vec!["i-1"]);
    }

    #[test]
    fn a_new_node_ready_marks_more_and_marked_nodes_stay_marked() {
        let mut nodes = three_old();
        let first = choose(vec![node_room(1000, 110)], &nodes);
        assert_eq!(first.mark, vec!["i-1"]);
        nodes[0].out_of_service = true;
        let second = choose(vec![node_room(1000, 110), node_room(1000, 110)], &nodes);
        assert_eq!(second.mark, vec!["i-1", "i-2"], "i-1 keeps its room first");
        assert_eq!(second.kept, vec!["i-3"]);
    }

    /// Room in total is not room: two nodes with 600m free each cannot take a 1000m pod.
    #[test]
    fn pods_are_placed_node_by_node_not_against_the_sum() {
        let nodes = vec![outdated("i-1", &[1000])];
        let decision = choose(vec![node_room(600, 110), node_room(600, 110)], &nodes);
        assert!(decision.mark.is_empty());
        let decision = choose(vec![node_room(600, 110), node_room(1000, 110)], &nodes);
        assert_eq!(decision.mark, vec!["i-1"]);
    }

    #[test]
    fn oldest_first_and_a_node_that_does_not_fit_does_not_stop_the_others() {
        let at = |second: i64| Some(jiff::Timestamp::from_second(1_700_000_000 + second).unwrap());
        let mut nodes = vec![
            outdated("i-big", &[900, 900, 900]),
            outdated("i-new", &[600]),
            outdated("i-old", &[600]),
            outdated("i-empty", &[]),
        ];
        nodes[0].launched = at(0);
        nodes[1].launched = at(20);
        nodes[2].launched = at(10);
        let decision = choose(vec![node_room(1000, 110)], &nodes);
        assert_eq!(
            decision.mark,
            vec!["i-old", "i-empty"],
            "i-new's pod no longer fits"
        );
        assert_eq!(decision.kept, vec!["i-big", "i-new"]);
    }

    /// A node already out of service whose pods do not fit keeps every outdated node in
    /// service, an empty one too: the pods short of room can only go there.
    #[test]
    fn pods_short_of_room_keep_every_outdated_node_in_service() {
        let mut nodes = vec![
            outdated("i-leaving", &[500, 500]),
            outdated("i-empty", &[]),
            outdated("i-small", &[100]),
        ];
        nodes[0].out_of_service = true;
        let decision = choose(vec![node_room(600, 110)], &nodes);
        assert_eq!(decision.mark, vec!["i-leaving"]);
        assert_eq!(decision.kept, vec!["i-empty", "i-small"]);
        let decision = choose(vec![node_room(1100, 110)], &nodes);
        assert_eq!(decision.mark, vec!["i-leaving", "i-empty", "i-small"]);
    }

    /// Terminate first, one group, as at `Started`: every node is outdated, so there is no
    /// room and nothing is marked. Whichever node Auto Scaling takes first, its pods fit on
    /// the nodes still schedulable (the old rule cordoned all but one "room" node; when Auto
    /// Scaling took that one first, its pods had no place and stayed Pending). Once the
    /// replacement is Ready, its room is used.
    #[test]
    fn terminate_first_never_leaves_the_first_replaced_nodes_pods_without_a_place() {
        let nodes = three_old();
        // Each node: 2000m allocatable, two 500m pods, so 1000m free.
        let free_on_outdated = node_room(1000, 108);
        let at_start = choose(Vec::new(), &nodes);
        for first in &nodes {
            let mut schedulable: Vec<Resources> = nodes
                .iter()
                .filter(|n| n.instance_id != first.instance_id)
                .filter(|n| !at_start.mark.contains(&n.instance_id))
                .map(|_| free_on_outdated)
                .collect();
            assert!(
                place_all(&mut schedulable, &first.pods_to_move),
                "the pods of {} have a place when it goes first",
                first.instance_id
            );
        }
        // i-3 went first; its pods moved onto i-1 and i-2; its replacement is Ready.
        let after = vec![
            outdated("i-1", &[500, 500, 500]),
            outdated("i-2", &[500, 500, 500]),
        ];
        let decision = choose(vec![node_room(2000, 110)], &after);
        assert_eq!(decision.mark, vec!["i-1"]);
    }
}

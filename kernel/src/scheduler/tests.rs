use super::*;
use alloc::collections::BTreeMap;
use alloc::vec;
use proptest::prelude::*;

fn candidate(run: &str, kind: WorkKind, queued_at_ms: u64) -> Candidate {
    Candidate {
        run_id: RunId::from(run),
        kind,
        queued_at_ms,
    }
}

fn capacity(max_workers: u32, live_workers: u32, pending_launches: u32) -> Capacity {
    Capacity {
        max_workers,
        live_workers,
        pending_launches,
    }
}

fn ids(admission: &Admission) -> Vec<&str> {
    admission.admitted.iter().map(RunId::as_str).collect()
}

#[test]
fn the_default_capacity_is_four_workers() {
    assert_eq!(DEFAULT_MAX_WORKERS, 4);
    assert_eq!(Capacity::idle().free_slots(), 4);
}

#[test]
fn pending_launches_count_against_capacity() {
    let waiting: Vec<Candidate> = (0..6)
        .map(|i| candidate(&alloc::format!("w{i}"), WorkKind::Workflow, i))
        .collect();
    assert_eq!(
        admit_next(capacity(4, 1, 2), &waiting, None).admitted.len(),
        1
    );
    assert_eq!(
        admit_next(capacity(4, 2, 2), &waiting, None).admitted.len(),
        0
    );
    assert_eq!(
        admit_next(capacity(4, 3, 3), &waiting, None).admitted.len(),
        0,
        "over capacity admits nothing"
    );
    assert_eq!(capacity(4, 3, 3).free_slots(), 0);
}

#[test]
fn one_kind_is_admitted_first_in_first_out_then_by_run_id() {
    let waiting = vec![
        candidate("c", WorkKind::Workflow, 20),
        candidate("b", WorkKind::Workflow, 10),
        candidate("a", WorkKind::Workflow, 10),
        candidate("d", WorkKind::Workflow, 30),
    ];
    let admission = admit_next(capacity(3, 0, 0), &waiting, None);
    assert_eq!(ids(&admission), vec!["a", "b", "c"]);
    assert_eq!(admission.last_kind, Some(WorkKind::Workflow));
}

#[test]
fn workflow_and_resource_manager_admissions_alternate() {
    let waiting = vec![
        candidate("w1", WorkKind::Workflow, 1),
        candidate("w2", WorkKind::Workflow, 2),
        candidate("w3", WorkKind::Workflow, 3),
        candidate("r1", WorkKind::ResourceManager, 50),
        candidate("r2", WorkKind::ResourceManager, 60),
    ];
    let admission = admit_next(capacity(4, 0, 0), &waiting, None);
    assert_eq!(ids(&admission), vec!["w1", "r1", "w2", "r2"]);
    let after_workflow = admit_next(capacity(1, 0, 0), &waiting, Some(WorkKind::Workflow));
    assert_eq!(
        ids(&after_workflow),
        vec!["r1"],
        "the rotation continues across decisions"
    );
    assert_eq!(after_workflow.last_kind, Some(WorkKind::ResourceManager));
}

#[test]
fn validation_children_take_their_turn_in_the_rotation() {
    let waiting = vec![
        candidate("w1", WorkKind::Workflow, 1),
        candidate("w2", WorkKind::Workflow, 2),
        candidate("v1", WorkKind::Validation, 9),
    ];
    let admission = admit_next(capacity(3, 0, 0), &waiting, Some(WorkKind::ResourceManager));
    assert_eq!(ids(&admission), vec!["v1", "w1", "w2"]);
}

#[test]
fn a_run_listed_twice_is_admitted_once() {
    let waiting = vec![
        candidate("a", WorkKind::Workflow, 5),
        candidate("a", WorkKind::Workflow, 1),
        candidate("b", WorkKind::Workflow, 3),
    ];
    assert_eq!(
        ids(&admit_next(capacity(4, 0, 0), &waiting, None)),
        vec!["a", "b"]
    );
}

#[test]
fn nothing_waiting_admits_nothing_and_keeps_the_last_kind() {
    let admission = admit_next(Capacity::idle(), &[], Some(WorkKind::Validation));
    assert!(admission.admitted.is_empty());
    assert_eq!(admission.last_kind, Some(WorkKind::Validation));
}

// ---- properties ------------------------------------------------------------

fn kind() -> impl Strategy<Value = WorkKind> {
    prop_oneof![
        Just(WorkKind::Workflow),
        Just(WorkKind::ResourceManager),
        Just(WorkKind::Validation),
    ]
}

fn candidates() -> impl Strategy<Value = Vec<Candidate>> {
    proptest::collection::vec((0u8..20, kind(), 0u64..50), 0..25).prop_map(|rows| {
        rows.into_iter()
            .map(|(run, kind, at)| candidate(&alloc::format!("r{run}"), kind, at))
            .collect()
    })
}

#[derive(Clone, Debug)]
enum Event {
    Arrive(WorkKind),
    Finish(u8),
    Launched,
    Schedule,
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        3 => kind().prop_map(Event::Arrive),
        2 => any::<u8>().prop_map(Event::Finish),
        1 => Just(Event::Launched),
        2 => Just(Event::Schedule),
    ]
}

proptest! {
    /// One decision never exceeds the free slots, admits each listed run at
    /// most once, only listed runs, and within each kind a FIFO prefix.
    #[test]
    fn one_decision_respects_capacity_and_fifo(
        waiting in candidates(),
        max in 0u32..6,
        live in 0u32..6,
        pending in 0u32..6,
        last in proptest::option::of(kind()),
    ) {
        let capacity = capacity(max, live, pending);
        let admission = admit_next(capacity, &waiting, last);
        prop_assert!(admission.admitted.len() as u32 <= capacity.free_slots());
        let distinct: BTreeSet<&RunId> = waiting.iter().map(|c| &c.run_id).collect();
        prop_assert_eq!(
            admission.admitted.len(),
            (capacity.free_slots() as usize).min(distinct.len())
        );
        let unique: BTreeSet<&RunId> = admission.admitted.iter().collect();
        prop_assert_eq!(unique.len(), admission.admitted.len());
        let queues = fifo_queues(&waiting);
        for queue in &queues {
            let admitted_here: Vec<&RunId> = queue.iter().map(|c| &c.run_id)
                .filter(|id| unique.contains(id)).collect();
            let prefix: Vec<&RunId> = queue.iter().take(admitted_here.len()).map(|c| &c.run_id).collect();
            prop_assert_eq!(admitted_here, prefix, "FIFO within a kind");
        }
    }

    /// A simulated server: work arrives, workers finish, launches turn live.
    /// Capacity is never exceeded, and every candidate is admitted within
    /// three admissions per candidate of its kind queued ahead of it (plus
    /// its own turn), so none starves while slots free up.
    #[test]
    fn capacity_holds_and_no_candidate_starves(
        max in 1u32..5,
        events in proptest::collection::vec(event(), 1..120),
    ) {
        let mut waiting: Vec<Candidate> = Vec::new();
        let mut live: Vec<RunId> = Vec::new();
        let mut pending: Vec<RunId> = Vec::new();
        let mut last = None;
        let mut admissions = 0usize;
        // For each waiting run: admissions so far when it arrived, and its bound.
        let mut budget: BTreeMap<RunId, (usize, usize)> = BTreeMap::new();
        for (now, event) in events.into_iter().enumerate() {
            match event {
                Event::Arrive(kind) => {
                    let run_id = RunId::new(alloc::format!("run-{now}"));
                    let ahead = waiting.iter().filter(|c| c.kind == kind).count();
                    budget.insert(run_id.clone(), (admissions, 3 * (ahead + 1)));
                    waiting.push(Candidate { run_id, kind, queued_at_ms: now as u64 });
                }
                Event::Finish(pick) if !live.is_empty() => {
                    live.remove(pick as usize % live.len());
                }
                Event::Launched if !pending.is_empty() => live.push(pending.remove(0)),
                Event::Schedule => {
                    let capacity = Capacity {
                        max_workers: max,
                        live_workers: live.len() as u32,
                        pending_launches: pending.len() as u32,
                    };
                    let admission = admit_next(capacity, &waiting, last);
                    last = admission.last_kind;
                    for run_id in admission.admitted {
                        admissions += 1;
                        let (arrived_at, bound) = budget.remove(&run_id).unwrap();
                        prop_assert!(admissions - arrived_at <= bound,
                            "{} waited {} admissions, bound {}", run_id, admissions - arrived_at, bound);
                        waiting.retain(|c| c.run_id != run_id);
                        pending.push(run_id);
                    }
                }
                _ => {}
            }
            prop_assert!(live.len() + pending.len() <= max as usize, "capacity exceeded");
        }
        for (run_id, (arrived_at, bound)) in &budget {
            prop_assert!(admissions - arrived_at < *bound, "{} is starving", run_id);
        }
    }
}

use super::*;
use alloc::vec;
use alloc::vec::Vec;
use proptest::prelude::*;

const DAY_MS: u64 = 24 * 60 * 60 * 1_000;
/// A time well past the retention period.
const NOW_MS: u64 = 100 * DAY_MS;

/// A terminal run that finished 31 days before `NOW_MS`, free of everything.
fn expired(n: u32) -> RetainedRun {
    RetainedRun {
        run_id: RunId::new(alloc::format!("run-{n}")),
        status: RunStatus::Completed,
        finished_at_ms: Some(NOW_MS - 31 * DAY_MS),
        protections: Protections::default(),
        outside_references: OutsideReferences::default(),
        ownership_known: true,
    }
}

fn keep(reason: KeepReason) -> Verdict {
    Verdict::Keep(reason)
}

// ---- selector ------------------------------------------------------------------

#[test]
fn a_complete_old_free_tree_expires() {
    let tree = [expired(1), expired(2), expired(3)];
    assert_eq!(select(&tree, NOW_MS), Verdict::Expire);
    assert_eq!(first_blocker(&tree, NOW_MS), None);
    for status in [RunStatus::Failed, RunStatus::TimedOut, RunStatus::Cancelled] {
        let run = RetainedRun {
            status,
            ..expired(1)
        };
        assert_eq!(select(&[run], NOW_MS), Verdict::Expire);
    }
}

#[test]
fn an_empty_tree_is_kept() {
    assert_eq!(select(&[], NOW_MS), keep(KeepReason::EmptyTree));
    assert_eq!(
        first_blocker(&[], NOW_MS),
        Some(Blocker {
            run_id: None,
            reason: KeepReason::EmptyTree
        })
    );
}

#[test]
fn a_nonterminal_descendant_keeps_the_tree() {
    for status in [RunStatus::Queued, RunStatus::Running, RunStatus::Waiting] {
        let child = RetainedRun {
            status,
            finished_at_ms: None,
            ..expired(2)
        };
        let tree = [expired(1), child];
        assert_eq!(select(&tree, NOW_MS), keep(KeepReason::NotTerminal));
        assert_eq!(
            first_blocker(&tree, NOW_MS).unwrap().run_id,
            Some(RunId::from("run-2"))
        );
    }
}

#[test]
fn a_terminal_run_without_finish_time_is_kept() {
    let run = RetainedRun {
        finished_at_ms: None,
        ..expired(1)
    };
    assert_eq!(select(&[run], NOW_MS), keep(KeepReason::NoFinishTime));
}

#[test]
fn the_cutoff_is_thirty_days_after_finish_exclusive() {
    let finished_at_ms = 5 * DAY_MS;
    let run = RetainedRun {
        finished_at_ms: Some(finished_at_ms),
        ..expired(1)
    };
    let at_cutoff = finished_at_ms + RETENTION_MS;
    assert_eq!(
        select(core::slice::from_ref(&run), at_cutoff),
        keep(KeepReason::Young)
    );
    assert_eq!(
        select(core::slice::from_ref(&run), at_cutoff + 1),
        Verdict::Expire
    );
    assert_eq!(select(&[run], finished_at_ms), keep(KeepReason::Young));
    // Before 30 days have passed since time zero nothing can be old.
    let ancient = RetainedRun {
        finished_at_ms: Some(0),
        ..expired(1)
    };
    assert_eq!(cutoff_ms(RETENTION_MS - 1), None);
    assert_eq!(
        select(&[ancient], RETENTION_MS - 1),
        keep(KeepReason::Young)
    );
}

#[test]
fn one_young_descendant_keeps_an_old_root() {
    let young = RetainedRun {
        finished_at_ms: Some(NOW_MS - DAY_MS),
        ..expired(2)
    };
    assert_eq!(
        select(&[expired(1), young], NOW_MS),
        keep(KeepReason::Young)
    );
}

fn protections_with(protected: Protected) -> Protections {
    let mut p = Protections::default();
    let flag = match protected {
        Protected::WaitingOrParkedRun => &mut p.waiting_or_parked_run,
        Protected::LiveQueueRow => &mut p.live_queue_row,
        Protected::PendingWorkflowMessage => &mut p.pending_workflow_message,
        Protected::OpenWorkflowTurn => &mut p.open_workflow_turn,
        Protected::PendingInteraction => &mut p.pending_interaction,
        Protected::PendingHumanDecision => &mut p.pending_human_decision,
        Protected::RecordingSessionSegment => &mut p.recording_session_segment,
        Protected::QueuedFollowUp => &mut p.queued_follow_up,
        Protected::ActiveLease => &mut p.active_lease,
        Protected::UnsettledEffect => &mut p.unsettled_effect,
        Protected::ControllerOwnership => &mut p.controller_ownership,
        Protected::ActiveRunnerContent => &mut p.active_runner_content,
        Protected::ResumableCheckpoint => &mut p.resumable_checkpoint,
        Protected::UndeliveredTerminalResult => &mut p.undelivered_terminal_result,
    };
    *flag = true;
    p
}

const ALL_PROTECTED: [Protected; 14] = Protected::ALL;

#[test]
fn every_protection_keeps_the_tree() {
    for protected in ALL_PROTECTED {
        let run = RetainedRun {
            protections: protections_with(protected),
            ..expired(2)
        };
        assert_eq!(
            select(&[expired(1), run], NOW_MS),
            keep(KeepReason::Protected { protected }),
            "{protected:?}"
        );
    }
}

#[test]
fn each_protection_flag_is_its_own_cause() {
    for set in ALL_PROTECTED {
        let protections = protections_with(set);
        for asked in ALL_PROTECTED {
            assert_eq!(
                protections.contains(asked),
                set == asked,
                "{set:?} {asked:?}"
            );
        }
    }
}

#[test]
fn protections_report_the_first_in_seed_order() {
    let mut both = protections_with(Protected::UndeliveredTerminalResult);
    both.open_workflow_turn = true;
    assert_eq!(both.first(), Some(Protected::OpenWorkflowTurn));
    assert_eq!(Protections::default().first(), None);
}

#[test]
fn outside_references_keep_the_tree() {
    let continued = RetainedRun {
        outside_references: OutsideReferences {
            continuation: true,
            step: false,
        },
        ..expired(1)
    };
    assert_eq!(
        select(&[continued], NOW_MS),
        keep(KeepReason::OutsideContinuation)
    );
    let stepped = RetainedRun {
        outside_references: OutsideReferences {
            continuation: false,
            step: true,
        },
        ..expired(1)
    };
    assert_eq!(
        select(&[stepped], NOW_MS),
        keep(KeepReason::OutsideStepReference)
    );
}

#[test]
fn unknown_ownership_keeps_the_tree() {
    let unowned = RetainedRun {
        ownership_known: false,
        ..expired(3)
    };
    assert_eq!(
        select(&[expired(1), unowned], NOW_MS),
        keep(KeepReason::UnknownOwnership)
    );
}

#[test]
fn the_first_cause_wins_across_the_whole_tree() {
    let unowned = RetainedRun {
        ownership_known: false,
        ..expired(1)
    };
    let running = RetainedRun {
        status: RunStatus::Running,
        finished_at_ms: None,
        ..expired(2)
    };
    let blocker = first_blocker(&[unowned, running], NOW_MS).unwrap();
    assert_eq!(blocker.reason, KeepReason::NotTerminal);
    assert_eq!(blocker.run_id, Some(RunId::from("run-2")));

    // Protections too are compared across runs, not run by run.
    let late = RetainedRun {
        protections: protections_with(Protected::UndeliveredTerminalResult),
        ..expired(1)
    };
    let early = RetainedRun {
        protections: protections_with(Protected::LiveQueueRow),
        ..expired(2)
    };
    let blocker = first_blocker(&[late, early], NOW_MS).unwrap();
    assert_eq!(
        blocker.reason,
        KeepReason::Protected {
            protected: Protected::LiveQueueRow
        }
    );
    assert_eq!(blocker.run_id, Some(RunId::from("run-2")));
}

// ---- sweep policy --------------------------------------------------------------

fn idle() -> ServerActivity {
    ServerActivity::default()
}

#[test]
fn a_first_sweep_starts_when_idle() {
    let started = start_sweep(&SweepSchedule::default(), &idle(), 0).unwrap();
    assert!(started.running);
    assert_eq!(
        start_sweep(&started, &idle(), 1),
        Err(SweepBlocked::AlreadyRunning)
    );
}

#[test]
fn any_busy_cause_blocks_a_sweep_in_a_fixed_order() {
    let cases = [
        (
            ServerActivity {
                shutting_down: true,
                maintenance_command: true,
                workflow_runners: 1,
                resource_runners: 1,
            },
            BusyCause::ShuttingDown,
        ),
        (
            ServerActivity {
                maintenance_command: true,
                workflow_runners: 1,
                ..idle()
            },
            BusyCause::MaintenanceCommand,
        ),
        (
            ServerActivity {
                workflow_runners: 1,
                resource_runners: 1,
                ..idle()
            },
            BusyCause::WorkflowRunner,
        ),
        (
            ServerActivity {
                resource_runners: 2,
                ..idle()
            },
            BusyCause::ResourceRunner,
        ),
    ];
    for (activity, cause) in cases {
        assert_eq!(
            start_sweep(&SweepSchedule::default(), &activity, 0),
            Err(SweepBlocked::Busy { cause })
        );
        assert_eq!(may_continue_sweep(&activity), Err(cause));
    }
    assert_eq!(may_continue_sweep(&idle()), Ok(()));
}

#[test]
fn a_completed_sweep_is_followed_by_at_most_one_per_day() {
    let started = start_sweep(&SweepSchedule::default(), &idle(), 1_000).unwrap();
    let ended = end_sweep(&started, SweepEnd::Completed, 2_000);
    assert_eq!(ended.next_check_at_ms, 2_000 + SWEEP_INTERVAL_MS);
    assert_eq!(
        start_sweep(&ended.schedule, &idle(), 2_000 + SWEEP_INTERVAL_MS - 1),
        Err(SweepBlocked::NotDue {
            due_at_ms: 2_000 + SWEEP_INTERVAL_MS
        })
    );
    assert!(start_sweep(&ended.schedule, &idle(), 2_000 + SWEEP_INTERVAL_MS).is_ok());
}

#[test]
fn a_failed_sweep_waits_five_minutes() {
    let started = start_sweep(&SweepSchedule::default(), &idle(), 0).unwrap();
    let ended = end_sweep(&started, SweepEnd::Failed, 10);
    assert!(!ended.schedule.running);
    assert_eq!(ended.next_check_at_ms, 10 + SWEEP_RETRY_MS);
    assert_eq!(
        start_sweep(&ended.schedule, &idle(), 10 + SWEEP_RETRY_MS - 1),
        Err(SweepBlocked::RetryWait {
            retry_at_ms: 10 + SWEEP_RETRY_MS
        })
    );
    let retried = start_sweep(&ended.schedule, &idle(), 10 + SWEEP_RETRY_MS).unwrap();
    // Completion clears the failure wait.
    let done = end_sweep(&retried, SweepEnd::Completed, 10 + SWEEP_RETRY_MS);
    assert_eq!(done.schedule.retry_at_ms, None);
}

#[test]
fn an_interrupted_sweep_remains_due() {
    let started = start_sweep(&SweepSchedule::default(), &idle(), 0).unwrap();
    let ended = end_sweep(&started, SweepEnd::Interrupted, 50);
    assert_eq!(ended.next_check_at_ms, 50 + SWEEP_RETRY_MS);
    assert_eq!(ended.schedule.completed_at_ms, None);
    // The next idle lifecycle trigger may continue at once.
    assert!(start_sweep(&ended.schedule, &idle(), 51).is_ok());
}

// ---- compaction ----------------------------------------------------------------

const MIB: u64 = 1_024 * 1_024;

fn pages(free_pages: u64, page_count: u64) -> PageStats {
    PageStats {
        page_size_bytes: 4_096,
        page_count,
        free_pages,
    }
}

#[test]
fn vacuum_needs_idle_64_mib_and_20_percent_free() {
    let free_64_mib = 64 * MIB / 4_096;
    assert_eq!(
        should_vacuum(&idle(), &pages(free_64_mib, free_64_mib * 5)),
        Ok(())
    );
    assert_eq!(
        should_vacuum(&idle(), &pages(free_64_mib - 1, free_64_mib * 2)),
        Err(VacuumSkip::TooLittleReclaimable)
    );
    assert_eq!(
        should_vacuum(&idle(), &pages(free_64_mib, free_64_mib * 5 + 1)),
        Err(VacuumSkip::TooFewFreePages)
    );
    let busy = ServerActivity {
        workflow_runners: 1,
        ..idle()
    };
    assert_eq!(
        should_vacuum(&busy, &pages(free_64_mib, free_64_mib)),
        Err(VacuumSkip::Busy {
            cause: BusyCause::WorkflowRunner
        })
    );
}

#[test]
fn vacuum_arithmetic_does_not_overflow() {
    let huge = PageStats {
        page_size_bytes: u64::MAX,
        page_count: u64::MAX,
        free_pages: u64::MAX,
    };
    assert_eq!(huge.reclaimable_bytes(), u64::MAX);
    assert_eq!(should_vacuum(&idle(), &huge), Ok(()));
}

// ---- properties ----------------------------------------------------------------

fn arb_protections() -> impl Strategy<Value = Protections> {
    // Mostly unprotected so that expiring trees are common.
    proptest::option::weighted(0.25, proptest::sample::select(ALL_PROTECTED.to_vec()))
        .prop_map(|protected| protected.map_or_else(Protections::default, protections_with))
}

fn arb_run(n: u32) -> impl Strategy<Value = RetainedRun> {
    let status = proptest::sample::select(vec![
        RunStatus::Completed,
        RunStatus::Completed,
        RunStatus::Failed,
        RunStatus::Cancelled,
        RunStatus::TimedOut,
        RunStatus::Running,
        RunStatus::Waiting,
        RunStatus::Queued,
    ]);
    let finished = proptest::option::weighted(0.95, 0u64..NOW_MS);
    let references = proptest::sample::select(vec![
        (false, false),
        (false, false),
        (false, false),
        (true, false),
        (false, true),
    ]);
    (
        status,
        finished,
        arb_protections(),
        references,
        proptest::bool::weighted(0.9),
    )
        .prop_map(
            move |(status, finished_at_ms, protections, (continuation, step), owned)| RetainedRun {
                run_id: RunId::new(alloc::format!("run-{n}")),
                status,
                finished_at_ms,
                protections,
                outside_references: OutsideReferences { continuation, step },
                ownership_known: owned,
            },
        )
}

fn arb_tree() -> impl Strategy<Value = Vec<RetainedRun>> {
    (1usize..6).prop_flat_map(|len| (0..len).map(|n| arb_run(n as u32)).collect::<Vec<_>>())
}

#[derive(Clone, Copy, Debug)]
enum SweepOp {
    Start,
    Complete,
    Interrupt,
    Fail,
    Busy(bool),
    Advance(u64),
}

fn sweep_op() -> impl Strategy<Value = SweepOp> {
    prop_oneof![
        Just(SweepOp::Start),
        Just(SweepOp::Complete),
        Just(SweepOp::Interrupt),
        Just(SweepOp::Fail),
        any::<bool>().prop_map(SweepOp::Busy),
        prop_oneof![0u64..SWEEP_RETRY_MS, 0u64..SWEEP_INTERVAL_MS].prop_map(SweepOp::Advance),
    ]
}

proptest! {
    /// A tree with any nonterminal, young, protected, outside-referenced or
    /// unknown-owner run is never selected; every other tree is.
    #[test]
    fn expire_exactly_when_every_run_is_free(tree in arb_tree(), now_ms in RETENTION_MS..NOW_MS) {
        let cutoff = now_ms - RETENTION_MS;
        let all_free = tree.iter().all(|run| {
            run.status.is_terminal()
                && run.finished_at_ms.is_some_and(|at| at < cutoff)
                && run.protections == Protections::default()
                && run.outside_references == OutsideReferences::default()
                && run.ownership_known
        });
        prop_assert_eq!(select(&tree, now_ms) == Verdict::Expire, all_free);
    }

    /// The verdict does not depend on the order the shell lists runs in, and
    /// an expired tree stays expired later.
    #[test]
    fn verdict_is_order_free_and_monotonic(tree in arb_tree(), now_ms in 0u64..NOW_MS, later in 0u64..NOW_MS) {
        let mut reversed = tree.clone();
        reversed.reverse();
        prop_assert_eq!(select(&tree, now_ms), select(&reversed, now_ms));
        if select(&tree, now_ms) == Verdict::Expire {
            prop_assert_eq!(select(&tree, now_ms + later), Verdict::Expire);
        }
    }

    /// The sweep and `state prune` share one selector: the sweep's verdict
    /// is the explicit-cutoff verdict at its cutoff, and an earlier cutoff
    /// (a longer `--older-than`) never expires a tree a later one keeps.
    #[test]
    fn the_sweep_is_the_prune_selector_at_its_cutoff(
        tree in arb_tree(),
        now_ms in 0u64..NOW_MS,
        earlier in 0u64..NOW_MS,
    ) {
        prop_assert_eq!(select(&tree, now_ms), select_before(&tree, cutoff_ms(now_ms)));
        let cutoff = now_ms;
        if select_before(&tree, Some(cutoff.saturating_sub(earlier))) == Verdict::Expire {
            prop_assert_eq!(select_before(&tree, Some(cutoff)), Verdict::Expire);
        }
        prop_assert_ne!(select_before(&tree, None), Verdict::Expire);
    }

    /// Over any sequence of triggers, completions, failures and busy periods:
    /// completed sweeps are at least 24 hours apart, no sweep starts while
    /// busy, and none starts within five minutes after a failure.
    #[test]
    fn sweep_schedule_limits_hold(ops in proptest::collection::vec(sweep_op(), 1..60)) {
        let mut schedule = SweepSchedule::default();
        let mut activity = idle();
        let mut now_ms = 0u64;
        let mut completions: Vec<u64> = Vec::new();
        let mut last_failure: Option<u64> = None;
        for op in ops {
            match op {
                SweepOp::Start => {
                    if let Ok(next) = start_sweep(&schedule, &activity, now_ms) {
                        prop_assert!(activity.busy().is_none());
                        prop_assert!(!schedule.running);
                        if let Some(failed_at) = last_failure {
                            prop_assert!(now_ms >= failed_at + SWEEP_RETRY_MS);
                        }
                        schedule = next;
                    }
                }
                SweepOp::Complete | SweepOp::Interrupt | SweepOp::Fail if schedule.running => {
                    let end = match op {
                        SweepOp::Complete => SweepEnd::Completed,
                        SweepOp::Interrupt => SweepEnd::Interrupted,
                        _ => SweepEnd::Failed,
                    };
                    if matches!(end, SweepEnd::Completed) {
                        completions.push(now_ms);
                        last_failure = None;
                    }
                    if matches!(end, SweepEnd::Failed) {
                        last_failure = Some(now_ms);
                    }
                    let ended = end_sweep(&schedule, end, now_ms);
                    prop_assert!(ended.next_check_at_ms > now_ms);
                    schedule = ended.schedule;
                }
                SweepOp::Complete | SweepOp::Interrupt | SweepOp::Fail => {}
                SweepOp::Busy(busy) => activity.workflow_runners = u32::from(busy),
                SweepOp::Advance(ms) => now_ms += ms,
            }
        }
        prop_assert!(completions.windows(2).all(|pair| pair[1] - pair[0] >= SWEEP_INTERVAL_MS));
    }
}

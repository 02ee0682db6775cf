use super::*;
use crate::ids::{ClientId, Digest, IdempotencyKey};
use crate::receipt::CommandOperation;

fn identity(client: &str, key: &str, payload: u8) -> CommandIdentity {
    CommandIdentity {
        client_id: ClientId::new(client),
        operation: CommandOperation::StateBackup,
        idempotency_key: IdempotencyKey::new(key),
        run_id: None,
        expected_revision: None,
        payload_digest: Digest::repeat(payload),
    }
}

#[test]
fn a_command_starts_when_nothing_runs() {
    assert_eq!(admit(None, &identity("c", "k", 1)), Admission::Start);
}

#[test]
fn an_exact_retry_joins_the_running_command() {
    let running = identity("c", "k", 1);
    assert_eq!(
        admit(Some(&running), &identity("c", "k", 1)),
        Admission::JoinRunning
    );
}

#[test]
fn the_same_key_with_another_payload_conflicts_and_others_wait() {
    let running = identity("c", "k", 1);
    assert_eq!(
        admit(Some(&running), &identity("c", "k", 2)),
        Admission::Conflict
    );
    assert_eq!(
        admit(Some(&running), &identity("c", "k2", 1)),
        Admission::Busy
    );
    assert_eq!(
        admit(Some(&running), &identity("other", "k", 1)),
        Admission::Busy
    );
    let mut prune = identity("c", "k", 1);
    prune.operation = CommandOperation::StatePrune;
    assert_eq!(admit(Some(&running), &prune), Admission::Conflict);
}

const NOW_MS: u64 = 1_000 * DAY_MS;

fn request(apply: bool, backup: bool, days: Option<u64>) -> PruneRequest {
    PruneRequest {
        apply,
        backup,
        older_than_days: days,
    }
}

#[test]
fn a_prune_is_a_dry_run_of_the_retention_period_by_default() {
    let plan = plan_prune(request(false, false, None), NOW_MS).unwrap();
    assert_eq!(plan.mode, PruneMode::DryRun);
    assert_eq!(plan.older_than_days, 30);
    assert_eq!(
        plan.cutoff_ms,
        crate::retention::cutoff_ms(NOW_MS),
        "the default cutoff is the sweep's"
    );
}

#[test]
fn applying_needs_a_backup_and_a_dry_run_takes_none() {
    assert_eq!(
        plan_prune(request(true, false, None), NOW_MS),
        Err(PruneRefusal::ApplyWithoutBackup)
    );
    assert_eq!(
        plan_prune(request(false, true, None), NOW_MS),
        Err(PruneRefusal::BackupWithoutApply)
    );
    let plan = plan_prune(request(true, true, Some(7)), NOW_MS).unwrap();
    assert_eq!(plan.mode, PruneMode::BackupThenApply);
    assert_eq!(plan.cutoff_ms, Some(NOW_MS - 7 * DAY_MS));
}

#[test]
fn the_days_are_bounded() {
    for days in [0, MAX_PRUNE_DAYS + 1, u64::MAX] {
        assert_eq!(
            plan_prune(request(false, false, Some(days)), NOW_MS),
            Err(PruneRefusal::DaysOutOfRange),
            "{days}"
        );
    }
    let plan = plan_prune(request(false, false, Some(MAX_PRUNE_DAYS)), NOW_MS).unwrap();
    assert_eq!(plan.cutoff_ms, None, "nothing is that old yet");
}

#[test]
fn a_backup_never_replaces_a_file() {
    let free = DestinationFacts {
        exists: false,
        directory_exists: true,
        is_state_file: false,
    };
    assert_eq!(check_destination(&free), Ok(()));
    assert_eq!(
        check_destination(&DestinationFacts {
            exists: true,
            ..free
        }),
        Err(BackupRefusal::DestinationExists)
    );
    assert_eq!(
        check_destination(&DestinationFacts {
            directory_exists: false,
            ..free
        }),
        Err(BackupRefusal::NoSuchDirectory)
    );
    assert_eq!(
        check_destination(&DestinationFacts {
            exists: true,
            is_state_file: true,
            ..free
        }),
        Err(BackupRefusal::StateFile),
        "the live state is named as such, before 'exists'"
    );
}

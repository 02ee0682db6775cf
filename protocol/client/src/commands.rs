//! Which operations are state-changing commands: they store a durable
//! receipt, so every one carries an idempotency key and a retry after a
//! dropped connection adopts the stored receipt instead of executing twice.
//!
//! Invariants:
//! - This is the client's only copy of the list (the kernel's
//!   `CommandOperation`; `server/tests/crate_graph.rs` pins the two equal).
//!   When codegen emits the list from the schema (`x-stateChanging`), this
//!   function becomes one call to it.
//! - The match is exhaustive: a new operation does not compile until it is
//!   classified here.

use protocol::generated::types::Operation;

/// Whether `operation` is a state-changing command.
pub fn is_state_changing(operation: Operation) -> bool {
    match operation {
        Operation::RunStart
        | Operation::RunPause
        | Operation::RunResume
        | Operation::RunCancel
        | Operation::RunRestart
        | Operation::CheckpointAnswer
        | Operation::DecisionAnswer
        | Operation::InteractionUpdate
        | Operation::InteractionSubmit
        | Operation::EffectRecover
        | Operation::SettingsUpdate
        | Operation::FollowUpAdd
        | Operation::FollowUpCancel
        | Operation::ResourceApply
        | Operation::ResourceReconcile
        | Operation::ResourceDelete
        | Operation::ServerStop
        | Operation::SessionViewClearTerminal
        | Operation::StateBackup
        | Operation::StatePrune
        | Operation::ChannelReload
        | Operation::ChannelRecover => true,
        Operation::WorkflowsList
        | Operation::RunsList
        | Operation::RunView
        | Operation::ViewPage
        | Operation::ViewContent
        | Operation::Subscribe
        | Operation::Unsubscribe
        | Operation::SessionViewGet
        | Operation::SessionEventsRecord
        | Operation::WorkflowMessageReportBranch
        | Operation::WorkflowTurnReport
        | Operation::ServerStatus
        | Operation::StateVerify
        | Operation::ChannelStatus => false,
    }
}

//! The Pi extension's session coordinator, played over one client
//! connection (`sessionView.get {coordinate: true}`,
//! `workflowMessage.reportBranch`, `workflowTurn.report`), and waiting for a
//! run's terminal message.

use super::*;
use pi_workflows_client::{Connection as Client, RequestSpec};
use serde_json::{Value, json};

/// Waits until `run_id`'s terminal message is stored (it is built after
/// the terminal commit, in its own job).
pub async fn wait_terminal_message(server: &TestServer, run_id: &str) -> String {
    let id = format!("terminal:{run_id}");
    wait_for(SETTLE_TIMEOUT, "the terminal message", || {
        let n = count(
            &server.db(),
            "SELECT COUNT(*) FROM workflow_messages WHERE message_id = ?1",
            [&id],
        );
        (n == 1).then_some(())
    })
    .await;
    id
}

/// The session's coordinator, played over one connection.
pub struct Coordinator {
    pub session: String,
    pub epoch: Value,
}

impl Coordinator {
    /// Takes the session's epoch and reports an idle, empty branch.
    pub async fn connect(client: &mut Client, session: &str) -> Self {
        let mut coordinator = Self {
            session: session.to_owned(),
            epoch: Value::Null,
        };
        let view = coordinator.view(client).await;
        coordinator.epoch = view["coordinatorEpoch"].clone();
        assert!(coordinator.epoch.is_u64(), "{view}");
        coordinator.branch(client, &[], true).await;
        coordinator
    }

    pub async fn view(&self, client: &mut Client) -> Value {
        let view = client
            .request(&RequestSpec::read(
                "sessionView.get",
                None,
                json!({ "sessionId": self.session, "coordinate": true }),
            ))
            .await
            .unwrap();
        assert_eq!(view.outcome, "accepted", "{:?}", view.frame);
        view.receipt.unwrap()
    }

    /// The message the server offers next, if any.
    pub async fn next(&self, client: &mut Client) -> Option<String> {
        self.view(client).await["nextEligibleMessageId"]
            .as_str()
            .map(str::to_owned)
    }

    pub async fn branch(&self, client: &mut Client, messages: &[&str], idle: bool) {
        let entries: Vec<Value> = messages
            .iter()
            .map(|id| json!({"messageId": id, "entryId": format!("entry-{id}")}))
            .collect();
        let response = client
            .request(&RequestSpec::read(
                "workflowMessage.reportBranch",
                None,
                json!({ "sessionId": self.session, "coordinatorEpoch": self.epoch,
                        "entries": entries, "isIdle": idle, "hasPendingMessages": false }),
            ))
            .await
            .unwrap();
        assert_eq!(response.outcome, "accepted", "{:?}", response.frame);
    }

    pub async fn turn(
        &self,
        client: &mut Client,
        message: &str,
        run_id: &str,
        turn: &str,
        phase: &str,
    ) {
        let mut payload = json!({ "sessionId": self.session, "coordinatorEpoch": self.epoch,
                                  "messageId": message, "runId": run_id, "turnId": turn,
                                  "phase": phase });
        if phase == "end" {
            payload["stopReason"] = json!("completed");
        }
        let response = client
            .request(&RequestSpec::read("workflowTurn.report", None, payload))
            .await
            .unwrap();
        assert_eq!(response.outcome, "accepted", "{:?}", response.frame);
    }

    /// Runs the one model turn of the sent `message` to its end.
    pub async fn run_turn(&self, client: &mut Client, message: &str, run_id: &str) {
        let turn = format!("turn-{message}");
        self.turn(client, message, run_id, &turn, "start").await;
        self.turn(client, message, run_id, &turn, "end").await;
    }
}

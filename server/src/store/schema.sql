-- pi-workflows-state, schema version 12 (version 1 kept the live view's node
-- list and step history as growing documents; version 2 had no step index
-- on node attempts, so a runner message read every finished step; version 3
-- counted an interactive node timeout on the wall clock, with no turn clock
-- on its request, and had no session capture; version 4 had no indexes for
-- deleting a run tree and collecting its blobs, and did not record the
-- content a runner reply references; version 5 did not record who
-- answered a human decision; version 6 did not accept a Telegram channel
-- as that source; version 7 had neither piw's answer dialog as a source
-- nor follow-up queues; version 8 had no durable turn intents; version 9
-- did not record a terminal decision turn's selected launch; version 10
-- had no live settings; version 11 had no resources, controller queue,
-- controller effects or child workflow requests; all are refused as
-- incompatible).
-- The SHA-256 of this file is the DDL digest stored in schema_meta. Any edit
-- changes the digest; an installed database with another digest is refused
-- before any mutation (alpha state policy: no migrations).

CREATE TABLE schema_meta (
  singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
  schema_name TEXT NOT NULL CHECK (schema_name = 'pi-workflows-state'),
  schema_version INTEGER NOT NULL CHECK (schema_version = 12),
  ddl_digest TEXT NOT NULL,
  created_at_ms INTEGER NOT NULL
) STRICT;

CREATE TABLE projects (
  project_id TEXT PRIMARY KEY,
  canonical_path TEXT NOT NULL UNIQUE,
  created_at_ms INTEGER NOT NULL
) STRICT;

-- Content-addressed values: canonical JSON and UTF-8 text.
CREATE TABLE blobs (
  digest BLOB PRIMARY KEY CHECK (length(digest) = 32),
  media_type TEXT NOT NULL,
  bytes BLOB NOT NULL,
  created_at_ms INTEGER NOT NULL
) STRICT;

-- The one server epoch and its live local lease.
CREATE TABLE workflow_host_state (
  singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
  epoch INTEGER NOT NULL CHECK (epoch >= 0),
  owner_id TEXT,
  lease_expires_at_ms INTEGER NOT NULL,
  started_at_ms INTEGER NOT NULL
) STRICT;

-- Compiled workflow definitions by digest: the topology the kernel routes on.
CREATE TABLE workflow_definitions (
  definition_digest TEXT PRIMARY KEY,
  workflow_name TEXT NOT NULL,
  topology_json TEXT NOT NULL,
  created_at_ms INTEGER NOT NULL
) STRICT;

CREATE TABLE runs (
  run_id TEXT PRIMARY KEY,
  project_id TEXT NOT NULL REFERENCES projects(project_id),
  workflow_name TEXT NOT NULL,
  workflow_ref TEXT NOT NULL,
  title TEXT,
  definition_digest TEXT NOT NULL REFERENCES workflow_definitions(definition_digest),
  input_digest BLOB NOT NULL REFERENCES blobs(digest),
  status TEXT NOT NULL CHECK (status IN ('queued', 'running', 'waiting', 'completed', 'failed', 'timed_out', 'cancelled')),
  paused INTEGER NOT NULL CHECK (paused IN (0, 1)),
  park_reason TEXT,
  revision INTEGER NOT NULL CHECK (revision >= 1),
  waiting_on TEXT,
  error_class TEXT,
  error_reason TEXT,
  error_node TEXT,
  error_message TEXT CHECK (error_message IS NULL OR length(error_message) <= 65536),
  continuation_of TEXT REFERENCES runs(run_id),
  continuation_checkpoint TEXT,
  continued_by TEXT,
  restart_json TEXT,
  -- The original run of this run's restart chain (restart_json's rootRunId).
  restart_root_run_id TEXT,
  update_tokens INTEGER NOT NULL DEFAULT 100,
  update_refilled_at_ms INTEGER NOT NULL DEFAULT 0,
  created_at_ms INTEGER NOT NULL,
  updated_at_ms INTEGER NOT NULL,
  finished_at_ms INTEGER
) STRICT;
CREATE INDEX runs_by_status ON runs(status, updated_at_ms);
CREATE INDEX runs_by_created ON runs(created_at_ms DESC, run_id DESC);
-- The restarts of one chain (the restart rule counts them all).
CREATE INDEX runs_by_restart_root ON runs(restart_root_run_id) WHERE restart_root_run_id IS NOT NULL;
-- State retention (store/retention.rs): the root runs of run trees by finish
-- time (the sweep's and prune's candidates), a tree's continuations, and the
-- references a deletion checks (a run's input blob, its definition).
CREATE INDEX runs_retention_roots ON runs(finished_at_ms, run_id)
  WHERE continuation_of IS NULL AND restart_root_run_id IS NULL;
CREATE INDEX runs_by_continuation ON runs(continuation_of) WHERE continuation_of IS NOT NULL;
CREATE INDEX runs_by_input ON runs(input_digest);
CREATE INDEX runs_by_definition ON runs(definition_digest);

CREATE TABLE run_sources (
  run_id TEXT PRIMARY KEY REFERENCES runs(run_id) ON DELETE CASCADE,
  project_path TEXT NOT NULL,
  source_json TEXT NOT NULL,
  input_hash TEXT NOT NULL,
  -- run.start's agentModel (canonical JSON), the runner launch's agentModel
  agent_model_json TEXT
) STRICT;

CREATE TABLE run_bindings (
  run_id TEXT PRIMARY KEY REFERENCES runs(run_id) ON DELETE CASCADE,
  execution_mode TEXT NOT NULL CHECK (execution_mode IN ('interactive', 'headless')),
  origin_session_id TEXT,
  CHECK ((execution_mode = 'interactive') = (origin_session_id IS NOT NULL))
) STRICT;

CREATE TABLE run_queue (
  run_id TEXT PRIMARY KEY REFERENCES runs(run_id) ON DELETE CASCADE,
  status TEXT NOT NULL CHECK (status IN ('queued', 'starting', 'running', 'parked', 'done', 'failed', 'cancelled')),
  origin_session_id TEXT,
  parent_run_id TEXT,
  queued_at_ms INTEGER NOT NULL,
  updated_at_ms INTEGER NOT NULL
) STRICT;
-- One queued or running reservation per Pi session.
CREATE UNIQUE INDEX run_queue_one_live_per_session ON run_queue(origin_session_id)
  WHERE origin_session_id IS NOT NULL AND status IN ('queued', 'starting', 'running');
-- One continuation per waiting parent.
CREATE UNIQUE INDEX run_queue_one_continuation ON run_queue(parent_run_id)
  WHERE parent_run_id IS NOT NULL;
CREATE INDEX run_queue_admission ON run_queue(status, queued_at_ms);

CREATE TABLE leases (
  run_id TEXT PRIMARY KEY REFERENCES runs(run_id) ON DELETE CASCADE,
  generation INTEGER NOT NULL CHECK (generation >= 0),
  owner_kind TEXT CHECK (owner_kind IN ('host', 'control')),
  owner_id TEXT,
  token_hash BLOB CHECK (token_hash IS NULL OR length(token_hash) = 32),
  acquired_at_ms INTEGER,
  heartbeat_at_ms INTEGER,
  expires_at_ms INTEGER,
  CHECK ((owner_kind IS NULL) = (expires_at_ms IS NULL))
) STRICT;
CREATE INDEX leases_by_expiry ON leases(expires_at_ms) WHERE expires_at_ms IS NOT NULL;

-- Immutable lifecycle events.
CREATE TABLE events (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  run_id TEXT NOT NULL,
  recorded_at_ms INTEGER NOT NULL,
  kind TEXT NOT NULL,
  payload TEXT NOT NULL CHECK (length(payload) <= 65536)
) STRICT;
CREATE INDEX events_by_run ON events(run_id, seq);

-- Durable command receipts. The fingerprint excludes the transport request id;
-- request ids are scoped by client (two clients may both use `r1`).
CREATE TABLE host_commands (
  request_id TEXT NOT NULL,
  client_id TEXT NOT NULL,
  operation TEXT NOT NULL,
  idempotency_key TEXT NOT NULL,
  run_id TEXT,
  expected_revision INTEGER,
  payload_digest BLOB NOT NULL CHECK (length(payload_digest) = 32),
  fingerprint BLOB NOT NULL CHECK (length(fingerprint) = 32),
  outcome TEXT NOT NULL CHECK (outcome IN ('accepted', 'rejected', 'notFound')),
  revision INTEGER,
  receipt_json TEXT NOT NULL,
  receipt_digest BLOB NOT NULL CHECK (length(receipt_digest) = 32),
  created_at_ms INTEGER NOT NULL,
  PRIMARY KEY (client_id, request_id)
) STRICT;
CREATE UNIQUE INDEX host_commands_by_key ON host_commands(client_id, idempotency_key);
-- A run's receipts (deleted with its tree), and the run a `run.start`
-- receipt started (its envelope names no run).
CREATE INDEX host_commands_by_run ON host_commands(run_id) WHERE run_id IS NOT NULL;
CREATE INDEX host_commands_by_started_run ON host_commands(json_extract(receipt_json, '$.receipt.runId'))
  WHERE operation = 'run.start';

-- Runner epochs, recorded before spawn.
CREATE TABLE run_workers (
  runner_epoch TEXT PRIMARY KEY,
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  generation INTEGER NOT NULL,
  server_epoch INTEGER NOT NULL,
  launch_digest BLOB,
  pid INTEGER,
  pid_start_identity TEXT,
  status TEXT NOT NULL CHECK (status IN ('launching', 'ready', 'exited')),
  outcome TEXT CHECK (outcome IS NULL OR outcome IN ('exited', 'cancelled', 'timedOut', 'crashed', 'claimLost', 'orphaned')),
  launched_at_ms INTEGER NOT NULL,
  ready_at_ms INTEGER,
  ready_revision INTEGER,
  finished_at_ms INTEGER,
  exit_code INTEGER,
  signal INTEGER,
  diagnostic_digest BLOB,
  CHECK ((status = 'exited') = (outcome IS NOT NULL))
) STRICT;
CREATE UNIQUE INDEX run_workers_one_active ON run_workers(run_id) WHERE status IN ('launching', 'ready');
-- A run's latest runner epoch (every run load).
CREATE INDEX run_workers_by_run ON run_workers(run_id, launched_at_ms);
CREATE INDEX run_workers_by_diagnostic ON run_workers(diagnostic_digest) WHERE diagnostic_digest IS NOT NULL;

-- Child process groups registered by runners (process.register).
CREATE TABLE runner_processes (
  pid INTEGER NOT NULL,
  start_identity TEXT NOT NULL,
  runner_epoch TEXT NOT NULL REFERENCES run_workers(runner_epoch) ON DELETE CASCADE,
  registered_at_ms INTEGER NOT NULL,
  PRIMARY KEY (pid, start_identity)
) STRICT;
CREATE INDEX runner_processes_by_epoch ON runner_processes(runner_epoch);

-- Receipts of accepted state-changing runner messages. `content_digest`
-- is the stored blob a reply references (a command state or a reply result
-- over one frame), written from the reply itself.
CREATE TABLE worker_messages (
  runner_epoch TEXT NOT NULL,
  message_id TEXT NOT NULL,
  payload_digest BLOB NOT NULL CHECK (length(payload_digest) = 32),
  outcome TEXT NOT NULL CHECK (outcome IN ('accepted', 'rejected', 'notFound')),
  revision INTEGER,
  reply_json TEXT NOT NULL,
  reply_digest BLOB NOT NULL CHECK (length(reply_digest) = 32),
  content_digest BLOB REFERENCES blobs(digest),
  created_at_ms INTEGER NOT NULL,
  PRIMARY KEY (runner_epoch, message_id)
) STRICT;
CREATE INDEX worker_messages_by_content ON worker_messages(content_digest) WHERE content_digest IS NOT NULL;

-- Attempt ids are unique per run; a continuation carries its parent's steps
-- under the same attempt ids (and step indexes). `step_index` is a finished
-- attempt's place among the run's finished steps (1, 2, …; NULL until it
-- finishes), so the latest one gives the count; `visit` of a node's latest
-- finished step is the node's number of finished steps.
CREATE TABLE node_attempts (
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  attempt_id TEXT NOT NULL,
  seq INTEGER NOT NULL,
  node_id TEXT NOT NULL,
  visit INTEGER NOT NULL CHECK (visit >= 1),
  generation INTEGER NOT NULL,
  status TEXT NOT NULL CHECK (status IN ('active', 'waiting', 'finished', 'abandoned')),
  outcome TEXT CHECK (outcome IS NULL OR outcome IN ('ok', 'failed', 'timed_out', 'cancelled')),
  carried INTEGER NOT NULL CHECK (carried IN (0, 1)),
  started_at_ms INTEGER NOT NULL,
  deadline_at_ms INTEGER,
  finished_at_ms INTEGER,
  crash_retries INTEGER NOT NULL DEFAULT 0,
  status_detail TEXT,
  output_digest BLOB REFERENCES blobs(digest),
  error_message TEXT,
  action_json TEXT,
  step_index INTEGER CHECK (step_index IS NULL OR step_index >= 1),
  CHECK ((status = 'finished') = (outcome IS NOT NULL)),
  PRIMARY KEY (run_id, attempt_id),
  UNIQUE (run_id, seq),
  UNIQUE (run_id, step_index)
) STRICT;
-- A node's finished steps in order: the bounded step summary a runner
-- message loads reads a node's latest one (or its latest up to an index).
CREATE INDEX node_attempts_steps_by_node ON node_attempts(run_id, node_id, step_index)
  WHERE status = 'finished';
-- One active (unfinished) attempt per run.
CREATE UNIQUE INDEX node_attempts_one_unfinished ON node_attempts(run_id)
  WHERE status IN ('active', 'waiting');
CREATE INDEX node_attempts_by_output ON node_attempts(output_digest) WHERE output_digest IS NOT NULL;

CREATE TABLE effects (
  effect_id TEXT PRIMARY KEY,
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  effect_type TEXT NOT NULL,
  node_path TEXT NOT NULL,
  visit INTEGER NOT NULL,
  request_fingerprint BLOB NOT NULL CHECK (length(request_fingerprint) = 32),
  state TEXT NOT NULL CHECK (state IN ('reserved', 'applying', 'applied', 'rejected', 'cancelled', 'ambiguous')),
  attempt_number INTEGER NOT NULL CHECK (attempt_number >= 1),
  node_attempt_id TEXT,
  result_digest BLOB,
  created_at_ms INTEGER NOT NULL,
  updated_at_ms INTEGER NOT NULL
) STRICT;
-- One deterministic effect key.
CREATE UNIQUE INDEX effects_by_key ON effects(run_id, effect_type, node_path, visit);
CREATE INDEX effects_by_result ON effects(result_digest) WHERE result_digest IS NOT NULL;

CREATE TABLE effect_attempts (
  effect_id TEXT NOT NULL REFERENCES effects(effect_id) ON DELETE CASCADE,
  attempt_number INTEGER NOT NULL,
  state TEXT NOT NULL,
  node_attempt_id TEXT,
  started_at_ms INTEGER NOT NULL,
  finished_at_ms INTEGER,
  PRIMARY KEY (effect_id, attempt_number)
) STRICT;

CREATE TABLE interactive_requests (
  interaction_id TEXT PRIMARY KEY,
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  attempt_id TEXT NOT NULL,
  node_id TEXT NOT NULL,
  target_session_id TEXT,
  kind TEXT NOT NULL CHECK (kind IN ('submittedOutput', 'assistantMessage')),
  contract_hash BLOB NOT NULL,
  status TEXT NOT NULL CHECK (status IN ('pending', 'accepted', 'cancelled', 'timedOut', 'failed')),
  accepted_submission_id TEXT,
  unproductive_turn_ends INTEGER NOT NULL DEFAULT 0,
  revision INTEGER NOT NULL DEFAULT 1,
  -- The node timeout in model-turn time (kernel::interaction::TurnClock):
  -- the budget left at the request, the time stopped segments consumed,
  -- and the start of the running segment.
  clock_budget_ms INTEGER CHECK (clock_budget_ms IS NULL OR clock_budget_ms >= 0),
  clock_consumed_ms INTEGER NOT NULL DEFAULT 0 CHECK (clock_consumed_ms >= 0),
  clock_running_since_ms INTEGER,
  prompt_digest BLOB REFERENCES blobs(digest),
  created_at_ms INTEGER NOT NULL,
  updated_at_ms INTEGER NOT NULL,
  FOREIGN KEY (run_id, attempt_id) REFERENCES node_attempts(run_id, attempt_id),
  UNIQUE (run_id, attempt_id)
) STRICT;
CREATE INDEX interactive_requests_by_prompt ON interactive_requests(prompt_digest) WHERE prompt_digest IS NOT NULL;

CREATE TABLE interactive_submissions (
  submission_id TEXT PRIMARY KEY,
  interaction_id TEXT NOT NULL REFERENCES interactive_requests(interaction_id) ON DELETE CASCADE,
  idempotency_key TEXT NOT NULL,
  payload_hash BLOB NOT NULL,
  payload_digest BLOB REFERENCES blobs(digest),
  outcome TEXT NOT NULL CHECK (outcome IN ('validating', 'accepted', 'rejected')),
  error_message TEXT,
  receipt_digest BLOB,
  submitted_at_ms INTEGER NOT NULL,
  UNIQUE (interaction_id, idempotency_key)
) STRICT;
CREATE INDEX interactive_submissions_by_payload ON interactive_submissions(payload_digest) WHERE payload_digest IS NOT NULL;
CREATE INDEX interactive_submissions_by_receipt ON interactive_submissions(receipt_digest) WHERE receipt_digest IS NOT NULL;

CREATE TABLE human_decisions (
  decision_id TEXT PRIMARY KEY,
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  node_id TEXT NOT NULL,
  -- The request's seal (runner.v1 HumanDecisionRequest.requestDigest), not
  -- a blob: the sealed request is the checkpoint attempt's output.
  request_digest BLOB NOT NULL,
  state TEXT NOT NULL CHECK (state IN ('pending', 'accepted', 'cancelled', 'expired')),
  provenance TEXT,
  answer_digest BLOB,
  deadline_at_ms INTEGER,
  default_answer_digest BLOB,
  continuation_run_id TEXT,
  -- Who answered an accepted human answer (client.v1 DecisionSource); never shown.
  answer_channel TEXT CHECK (answer_channel IS NULL OR answer_channel IN ('pi', 'cli', 'piw', 'telegram')),
  answer_actor_id TEXT,
  created_at_ms INTEGER NOT NULL,
  updated_at_ms INTEGER NOT NULL
) STRICT;
-- A run's pending decision (every run load).
CREATE INDEX human_decisions_by_run ON human_decisions(run_id, state);
CREATE INDEX human_decisions_by_answer ON human_decisions(answer_digest) WHERE answer_digest IS NOT NULL;
CREATE INDEX human_decisions_by_default ON human_decisions(default_answer_digest) WHERE default_answer_digest IS NOT NULL;
CREATE INDEX human_decisions_by_continuation ON human_decisions(continuation_run_id) WHERE continuation_run_id IS NOT NULL;

CREATE TABLE workflow_messages (
  message_id TEXT PRIMARY KEY,
  session_id TEXT NOT NULL,
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  kind TEXT NOT NULL CHECK (kind IN ('step', 'decision', 'notification', 'terminal', 'followUp')),
  source_id TEXT,
  step_reason TEXT CHECK (step_reason IS NULL OR step_reason IN ('initial', 'reminder', 'resumed')),
  -- A message is written with its content, in the same transaction.
  content_digest BLOB NOT NULL REFERENCES blobs(digest),
  session_order INTEGER NOT NULL,
  state TEXT NOT NULL CHECK (state IN ('pending', 'sent', 'cancelled')),
  entry_id TEXT,
  version INTEGER NOT NULL DEFAULT 1,
  created_at_ms INTEGER NOT NULL,
  updated_at_ms INTEGER NOT NULL,
  UNIQUE (session_id, session_order)
) STRICT;
-- One pending step message per interactive request.
CREATE UNIQUE INDEX workflow_messages_one_pending_step ON workflow_messages(source_id)
  WHERE kind = 'step' AND state = 'pending';
-- A run's pending messages (every run load).
CREATE INDEX workflow_messages_by_run ON workflow_messages(run_id, state, session_order);
CREATE INDEX workflow_messages_by_content ON workflow_messages(content_digest);

CREATE TABLE workflow_turns (
  turn_id TEXT PRIMARY KEY,
  message_id TEXT NOT NULL REFERENCES workflow_messages(message_id) ON DELETE CASCADE,
  run_id TEXT NOT NULL,
  session_id TEXT NOT NULL,
  state TEXT NOT NULL CHECK (state IN ('open', 'completed', 'aborted', 'error', 'lost')),
  started_at_ms INTEGER NOT NULL,
  ended_at_ms INTEGER,
  response_entry_id TEXT
) STRICT;
-- A run's open turns (every run load).
CREATE INDEX workflow_turns_by_run ON workflow_turns(run_id, state, started_at_ms);
CREATE INDEX workflow_turns_by_message ON workflow_turns(message_id);

-- Post-run follow-ups (followUp.add, kernel::follow_up): one ordered queue
-- per origin session. A position only grows, so the queue row outlives the
-- runs its follow-ups waited for.
CREATE TABLE workflow_follow_up_queues (
  session_id TEXT PRIMARY KEY,
  next_position INTEGER NOT NULL CHECK (next_position >= 1),
  updated_at_ms INTEGER NOT NULL
) STRICT;

-- One follow-up: queued against the first run of a continuation chain until
-- the chain's final leaf ends; then messaged (its workflow message, on that
-- leaf, carries the delivery state) or cancelled.
CREATE TABLE workflow_follow_ups (
  follow_up_id TEXT PRIMARY KEY,
  session_id TEXT NOT NULL REFERENCES workflow_follow_up_queues(session_id),
  chain_run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  position INTEGER NOT NULL CHECK (position >= 1),
  prompt TEXT NOT NULL,
  state TEXT NOT NULL CHECK (state IN ('queued', 'messaged', 'cancelled')),
  message_id TEXT UNIQUE REFERENCES workflow_messages(message_id) ON DELETE CASCADE,
  created_at_ms INTEGER NOT NULL,
  updated_at_ms INTEGER NOT NULL,
  UNIQUE (session_id, position),
  CHECK (state <> 'messaged' OR message_id IS NOT NULL),
  CHECK (state <> 'queued' OR message_id IS NULL)
) STRICT;
-- A chain's follow-ups (settled when its leaf ends; deleted with its tree).
CREATE INDEX workflow_follow_ups_by_chain ON workflow_follow_ups(chain_run_id, state, position);

-- Live settings (settings.update, kernel::settings): each scope's current
-- value (a JSON object) and revision, its public change number. A scope is
-- `user` or one project's (`project:<projectId>`); its row appears with its
-- first change.
CREATE TABLE workflow_settings (
  scope_key TEXT PRIMARY KEY,
  scope TEXT NOT NULL CHECK (scope IN ('user', 'project')),
  project_id TEXT REFERENCES projects(project_id),
  revision INTEGER NOT NULL CHECK (revision >= 1),
  value_json TEXT NOT NULL CHECK (json_type(value_json) = 'object'),
  updated_at_ms INTEGER NOT NULL,
  CHECK ((scope = 'project') = (project_id IS NOT NULL)),
  CHECK (scope_key = CASE scope WHEN 'user' THEN 'user' ELSE 'project:' || project_id END)
) STRICT;
-- One scope per project (and the index of its foreign key).
CREATE UNIQUE INDEX workflow_settings_by_project ON workflow_settings(project_id);

-- One row per accepted patch that changed a scope: the patch, the revision
-- it made, and the command receipt (host_commands' client id and
-- idempotency key) that acknowledged it, written in the receipt's
-- transaction with the scope's new value.
CREATE TABLE workflow_setting_changes (
  scope_key TEXT NOT NULL REFERENCES workflow_settings(scope_key),
  revision INTEGER NOT NULL CHECK (revision >= 1),
  patch_json TEXT NOT NULL CHECK (json_type(patch_json) = 'object'),
  client_id TEXT NOT NULL,
  idempotency_key TEXT NOT NULL,
  changed_at_ms INTEGER NOT NULL,
  PRIMARY KEY (scope_key, revision)
) STRICT;

-- The settings revisions a run saw (0: the scope had no change yet), written
-- with the run's first rows; a checkpoint continuation copies its parent's.
CREATE TABLE workflow_setting_bindings (
  run_id TEXT PRIMARY KEY REFERENCES runs(run_id) ON DELETE CASCADE,
  user_revision INTEGER NOT NULL CHECK (user_revision >= 0),
  project_revision INTEGER NOT NULL CHECK (project_revision >= 0)
) STRICT;

-- Managed resources (kernel::resource, CONTROLLERS): one row per controller
-- and key. resource_version grows by one on every write of the row,
-- generation only when the spec's canonical digest changes. controller_path
-- and source_digest are the controller file the spec was accepted under
-- (resource.apply re-checks discovery and the digest in its receipt
-- transaction); project_path is the project it was applied from (NULL:
-- only the home controllers directory was searched).
CREATE TABLE resources (
  controller TEXT NOT NULL CHECK (length(controller) BETWEEN 1 AND 64),
  resource_key TEXT NOT NULL CHECK (length(CAST(resource_key AS BLOB)) BETWEEN 1 AND 512),
  uid TEXT NOT NULL UNIQUE,
  resource_version INTEGER NOT NULL CHECK (resource_version >= 1),
  generation INTEGER NOT NULL CHECK (generation >= 1),
  spec_json TEXT NOT NULL CHECK (json_valid(spec_json)),
  spec_digest BLOB NOT NULL CHECK (length(spec_digest) = 32),
  status_json TEXT NOT NULL CHECK (json_type(status_json) = 'object'),
  deletion_requested_at_ms INTEGER,
  finalizers_json TEXT NOT NULL CHECK (json_type(finalizers_json) = 'array'),
  controller_path TEXT NOT NULL,
  project_path TEXT,
  source_digest BLOB NOT NULL CHECK (length(source_digest) = 32),
  created_at_ms INTEGER NOT NULL,
  updated_at_ms INTEGER NOT NULL,
  PRIMARY KEY (controller, resource_key)
) STRICT;

-- The controller work queue (kernel::reconcile): one row per resource,
-- written with it and deleted with it. available_at_ms NULL: idle. version
-- grows by one per enqueue. claim_generation is the shared lease generation
-- (the last one handed out; it only grows); a live or expired claim has its
-- token hash, expiry and the version it claimed, and none of them without
-- the others.
CREATE TABLE resource_queue (
  resource_uid TEXT PRIMARY KEY REFERENCES resources(uid) ON DELETE CASCADE,
  available_at_ms INTEGER,
  version INTEGER NOT NULL CHECK (version >= 1),
  consecutive_errors INTEGER NOT NULL CHECK (consecutive_errors >= 0),
  last_error TEXT CHECK (last_error IS NULL OR length(CAST(last_error AS BLOB)) <= 8192),
  claim_generation INTEGER NOT NULL CHECK (claim_generation >= 0),
  claim_token_hash BLOB CHECK (claim_token_hash IS NULL OR length(claim_token_hash) = 32),
  claim_expires_at_ms INTEGER,
  claimed_version INTEGER,
  CHECK ((claim_token_hash IS NULL) = (claim_expires_at_ms IS NULL)),
  CHECK ((claim_token_hash IS NULL) = (claimed_version IS NULL))
) STRICT;
-- Admission: the rows available soonest.
CREATE INDEX resource_queue_available ON resource_queue(available_at_ms)
  WHERE available_at_ms IS NOT NULL;

-- A controller's external effects (kernel::controller_effect): reserved
-- (pending) before any provider call, observed before any retry. Kind,
-- request fingerprint and generation never change under a key.
-- external_ref and error are what apply reported (bounded, no payloads).
CREATE TABLE controller_effects (
  resource_uid TEXT NOT NULL REFERENCES resources(uid) ON DELETE CASCADE,
  effect_key TEXT NOT NULL CHECK (length(CAST(effect_key AS BLOB)) BETWEEN 1 AND 512),
  kind TEXT NOT NULL CHECK (length(CAST(kind AS BLOB)) BETWEEN 1 AND 512),
  request_fingerprint BLOB NOT NULL CHECK (length(request_fingerprint) = 32),
  generation INTEGER NOT NULL CHECK (generation >= 1),
  state TEXT NOT NULL CHECK (state IN ('pending', 'applied', 'rejected', 'indeterminate')),
  started_at_ms INTEGER NOT NULL,
  completed_at_ms INTEGER,
  external_ref TEXT CHECK (external_ref IS NULL OR length(CAST(external_ref AS BLOB)) <= 1024),
  error TEXT CHECK (error IS NULL OR length(CAST(error AS BLOB)) <= 8192),
  PRIMARY KEY (resource_uid, effect_key)
) STRICT;

-- A controller's child workflow requests (kernel::child_workflow): one per
-- resource and stable request key. run_id is the current attempt's run,
-- reserved here before the run exists (so no foreign key); workflow and
-- input fingerprint never change under a key.
CREATE TABLE controller_child_requests (
  resource_uid TEXT NOT NULL REFERENCES resources(uid) ON DELETE CASCADE,
  request_key TEXT NOT NULL CHECK (length(CAST(request_key AS BLOB)) BETWEEN 1 AND 512),
  workflow TEXT NOT NULL,
  input_fingerprint BLOB NOT NULL CHECK (length(input_fingerprint) = 32),
  attempt INTEGER NOT NULL CHECK (attempt >= 1),
  run_id TEXT NOT NULL UNIQUE,
  state TEXT NOT NULL CHECK (state IN ('running', 'waiting', 'succeeded', 'failed', 'interrupted')),
  created_at_ms INTEGER NOT NULL,
  updated_at_ms INTEGER NOT NULL,
  PRIMARY KEY (resource_uid, request_key)
) STRICT;

-- The resources' audit feed (the views' recent events): append-only, kept
-- after the resource row is deleted. detail is a bounded phrase, never spec
-- or status contents.
CREATE TABLE resource_events (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  controller TEXT NOT NULL,
  resource_key TEXT NOT NULL,
  resource_uid TEXT NOT NULL,
  kind TEXT NOT NULL CHECK (kind IN ('applied', 'reconcile_requested', 'deletion_requested',
    'reconcile_started', 'reconcile_settled', 'reconcile_requeued', 'reconcile_conflict',
    'reconcile_failed', 'claim_lost', 'effect_reserved', 'effect_settled', 'effect_recovered',
    'workflow_started', 'workflow_ended', 'resource_deleted')),
  resource_version INTEGER,
  generation INTEGER,
  at_ms INTEGER NOT NULL,
  detail TEXT CHECK (detail IS NULL OR length(CAST(detail AS BLOB)) <= 1024)
) STRICT;
CREATE INDEX resource_events_by_resource ON resource_events(controller, resource_key, seq);

-- Turn intents (kernel::intent, DEFERRED_TURNS): the one successor model
-- turn an eligible event of an interactive run owes its origin session, and
-- the message that claimed it before it could be sent. One row per source
-- event; at most one message claims it; a claimed intent is never eligible
-- again for another message. `presentation_json` holds the card's small
-- display fields (kernel::terminal::Presentation), never input or result.
CREATE TABLE turn_intents (
  intent_id TEXT PRIMARY KEY CHECK (intent_id LIKE 'deferred-turn:%'),
  source_id TEXT NOT NULL UNIQUE CHECK (source_id LIKE 'turn-source:%'),
  session_id TEXT NOT NULL,
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  cause TEXT NOT NULL CHECK (cause IN ('agentCancelled', 'timedOut', 'failed', 'launchFailed', 'controllerInterrupted', 'claimLost', 'terminal', 'cancelled')),
  node_id TEXT,
  attempt_id TEXT,
  eligible_at_ms INTEGER,
  stops_by_default INTEGER NOT NULL CHECK (stops_by_default IN (0, 1)),
  message_id TEXT UNIQUE REFERENCES workflow_messages(message_id) ON DELETE CASCADE,
  presentation_json TEXT,
  created_at_ms INTEGER NOT NULL,
  CHECK (message_id IS NULL OR eligible_at_ms IS NOT NULL)
) STRICT;
-- A run's intents (the unresolved one is reused by a later event).
CREATE INDEX turn_intents_by_run ON turn_intents(run_id);

-- Selected launches (kernel::launch, DEFERRED_TURNS "Selected launch and
-- restart"): the one launch (a restart, or a start of another workflow) the
-- terminal decision turn of an intent reserved, with the model's tool call and
-- the request fingerprint; the run is held until the turn settles.
CREATE TABLE selected_launches (
  intent_id TEXT PRIMARY KEY REFERENCES turn_intents(intent_id) ON DELETE CASCADE,
  run_id TEXT NOT NULL UNIQUE REFERENCES runs(run_id) ON DELETE CASCADE,
  tool_call_id TEXT NOT NULL,
  request_fingerprint BLOB NOT NULL CHECK (length(request_fingerprint) = 32),
  created_at_ms INTEGER NOT NULL
) STRICT;

-- A run's session capture (sessionEvents.record, kernel::capture): how many
-- events it holds and the replay state after the last one.
CREATE TABLE session_captures (
  run_id TEXT PRIMARY KEY REFERENCES runs(run_id) ON DELETE CASCADE,
  events INTEGER NOT NULL CHECK (events >= 0 AND events <= 1000000),
  replay_state_json TEXT NOT NULL,
  updated_at_ms INTEGER NOT NULL
) STRICT;

-- Captured Pi session events of a run's workflow turns, numbered run-wide
-- from 1 without gaps; the digest is over the canonical {data, type}.
-- Presentation only: never read into a run's state or a runner's command.
CREATE TABLE session_events (
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  run_seq INTEGER NOT NULL CHECK (run_seq >= 1),
  event_type TEXT NOT NULL,
  data_json TEXT NOT NULL CHECK (length(data_json) <= 65536),
  digest BLOB NOT NULL CHECK (length(digest) = 32),
  recorded_at_ms INTEGER NOT NULL,
  PRIMARY KEY (run_id, run_seq)
) STRICT;

-- The latest value per (type, key) of published workflow updates.
CREATE TABLE workflow_updates (
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  update_type TEXT NOT NULL,
  update_key TEXT NOT NULL,
  update_id TEXT NOT NULL,
  seq INTEGER NOT NULL,
  node_id TEXT NOT NULL,
  attempt_id TEXT NOT NULL,
  data_json TEXT NOT NULL CHECK (length(data_json) <= 65536),
  at_ms INTEGER NOT NULL,
  PRIMARY KEY (run_id, update_type, update_key)
) STRICT;

CREATE TABLE update_receipts (
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  idempotency_key TEXT NOT NULL,
  receipt_json TEXT NOT NULL,
  PRIMARY KEY (run_id, idempotency_key)
) STRICT;

-- Live view projection: one presentation revision per run and retained patches.
-- Every part is kept as small rows changed in place or appended, so the next
-- patch comes from the rows the transaction changed, never from a rebuild or
-- a diff of the whole view: the header, one row per topology node, one row
-- per graph step (append-only; only the last step changes while its
-- attempts run), and the update page.
CREATE TABLE viewer_runs (
  run_id TEXT PRIMARY KEY REFERENCES runs(run_id) ON DELETE CASCADE,
  presentation_revision INTEGER NOT NULL,
  retained_floor INTEGER NOT NULL,
  header_json TEXT,
  -- Graph steps: how many, how many lead the inline page and their bytes.
  steps_total INTEGER NOT NULL DEFAULT 0,
  steps_inline INTEGER NOT NULL DEFAULT 0,
  steps_inline_bytes INTEGER NOT NULL DEFAULT 0,
  -- The node_attempts seq of the last step's first attempt (0: no step).
  steps_tail_seq INTEGER NOT NULL DEFAULT 0,
  -- SHA-256 state over the graph history's final prefix (`[` and every
  -- step but the last, each followed by `,`) and that prefix's length.
  history_state BLOB,
  history_prefix_bytes INTEGER NOT NULL DEFAULT 1,
  -- Nodes whose entry depends on the unfinished attempt or the checkpoint.
  hot_nodes_json TEXT,
  updates_json TEXT,
  updates_total INTEGER NOT NULL DEFAULT 0
) STRICT;

-- One entry per topology node of a run's view, in definition order.
CREATE TABLE viewer_nodes (
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  node_index INTEGER NOT NULL,
  node_id TEXT NOT NULL,
  visits INTEGER NOT NULL,
  last_outcome TEXT,
  document TEXT NOT NULL,
  PRIMARY KEY (run_id, node_index),
  UNIQUE (run_id, node_id)
) STRICT;

-- The graph history: one row per step (node visit), appended; only the last
-- row changes while its attempts run. `document` is the complete step in
-- canonical JSON, `shown` the step as a view shows it (newest attempts).
CREATE TABLE viewer_steps (
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  seq INTEGER NOT NULL CHECK (seq >= 1),
  node_id TEXT NOT NULL,
  visit INTEGER NOT NULL,
  document TEXT NOT NULL,
  shown TEXT NOT NULL,
  PRIMARY KEY (run_id, seq),
  UNIQUE (run_id, node_id, visit)
) STRICT;

-- Advertised graph-history references: the first `steps - 1` rows of
-- viewer_steps (final) followed by `tail`, the last step as it was.
CREATE TABLE viewer_history_refs (
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  digest BLOB NOT NULL CHECK (length(digest) = 32),
  steps INTEGER NOT NULL,
  tail TEXT,
  bytes INTEGER NOT NULL,
  PRIMARY KEY (run_id, digest)
) STRICT;

-- The run list's revision: increases with every presentation revision of any run.
CREATE TABLE viewer_list (
  singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
  revision INTEGER NOT NULL
) STRICT;
INSERT INTO viewer_list (singleton, revision) VALUES (1, 0);

-- Origin sessions whose retained terminal view was cleared.
CREATE TABLE session_views (
  session_id TEXT PRIMARY KEY,
  cleared_at_ms INTEGER NOT NULL
) STRICT;

CREATE TABLE viewer_deltas (
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  presentation_revision INTEGER NOT NULL,
  delta_index INTEGER NOT NULL,
  patch_json TEXT NOT NULL,
  PRIMARY KEY (run_id, presentation_revision, delta_index)
) STRICT;

CREATE TABLE viewer_session_checkpoints (
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  event_seq INTEGER NOT NULL,
  checkpoint_digest BLOB NOT NULL,
  PRIMARY KEY (run_id, event_seq)
) STRICT;
CREATE INDEX viewer_session_checkpoints_by_digest ON viewer_session_checkpoints(checkpoint_digest);

-- Generated view content, scoped to one run, digest and media type.
CREATE TABLE run_view_content (
  run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
  digest BLOB NOT NULL CHECK (length(digest) = 32),
  media_type TEXT NOT NULL,
  role TEXT NOT NULL CHECK (role IN ('definition', 'graphHistory', 'reason')),
  bytes BLOB NOT NULL,
  created_at_ms INTEGER NOT NULL,
  PRIMARY KEY (run_id, digest, media_type)
) STRICT;

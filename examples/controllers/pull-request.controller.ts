/**
 * Pull-request automation: one resource per pull request, keyed as you like
 * (`owner/repo#7`), with the spec `{forge, repo, number, reviewWorkflow?,
 * mergeMethod?}`: `forge` is the base URL of a GitHub-shaped forge API (the
 * tests use a fake one on 127.0.0.1, sdk-ts/test-support/fake-forge.ts).
 *
 * Each reconcile pass observes the forge, does at most one thing and
 * requeues:
 * 1. the finalizer first (before anything this controller must clean up);
 * 2. the `pi-workflows` label on the pull request (an effect: observed
 *    before any retry; removed again on deletion, which the finalizer
 *    guards);
 * 3. a review workflow run per head (`ctx.workflows.ensure` with the request
 *    key `review:<n>:<head>`: a new head is a new review, the same head finds
 *    the same run);
 * 4. once the review succeeded, wait for the head's checks;
 * 5. checks green: record `merging` with the head in the status, then
 * 6. the merge effect, keyed by the head, sent with that head as the
 *    expected sha (the forge refuses a merge of another head: `rejected`)
 *    and an Idempotency-Key (a retried request is answered, not merged
 *    again). An exception (a lost response) leaves it `indeterminate`: the
 *    next pass observes the forge (is the pull request merged at that head?)
 *    before any retry.
 * Conditions: Ready, ChecksPassed, Merged. Deletion removes the label, then
 * the finalizer.
 */
import { conditionFalse, conditionTrue, conditionUnknown, defineController, type ReconcileContext, type Resource, type StatusPatch } from "@pi-workflows/sdk/controllers";

interface Spec {
  /** Base URL of the forge API, e.g. http://127.0.0.1:8080/ */
  forge: string;
  /** owner/name */
  repo: string;
  number: number;
  /** The review workflow (default `pr-review`, examples/workflows/pr-review.workflow.ts). */
  reviewWorkflow?: string;
  mergeMethod?: "merge" | "squash" | "rebase";
}

type Phase = "new" | "reviewing" | "waitingForChecks" | "merging" | "merged" | "closed" | "blocked";

interface Status {
  phase: Phase;
  /** The head the pass worked on. */
  head?: string;
  /** How the label effect ended (once applied or rejected it is not tried again). */
  label?: string;
}

const FINALIZER = "pull-request.examples/label";
const LABEL = "pi-workflows";

interface Pull {
  state: "open" | "closed";
  merged: boolean;
  head: string;
  title: string;
  labels: string[];
}

/** A forge answer that is not what the controller can act on (status code only: no response contents). */
class ForgeError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ForgeError";
  }
}

async function forge(spec: Spec, signal: AbortSignal, method: string, path: string, body?: unknown, headers: Record<string, string> = {}): Promise<{ status: number; body: unknown }> {
  const response = await fetch(new URL(path.replace(/^\//, ""), spec.forge.endsWith("/") ? spec.forge : `${spec.forge}/`), {
    method,
    signal,
    headers: { accept: "application/json", ...(body !== undefined ? { "content-type": "application/json" } : {}), ...headers },
    ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
  });
  const text = await response.text();
  let parsed: unknown = null;
  try {
    parsed = text === "" ? null : JSON.parse(text);
  } catch {
    parsed = null;
  }
  return { status: response.status, body: parsed };
}

async function getPull(spec: Spec, signal: AbortSignal): Promise<Pull> {
  const { status, body } = await forge(spec, signal, "GET", `/repos/${spec.repo}/pulls/${spec.number}`);
  if (status !== 200) throw new ForgeError(`GET pull request answered ${status}`);
  const pull = body as { state: "open" | "closed"; merged: boolean; head: { sha: string }; title: string; labels: Array<{ name: string }> };
  return { state: pull.state, merged: pull.merged, head: pull.head.sha, title: pull.title, labels: pull.labels.map((l) => l.name) };
}

async function getChecks(spec: Spec, signal: AbortSignal, head: string): Promise<"pending" | "success" | "failure"> {
  const { status, body } = await forge(spec, signal, "GET", `/repos/${spec.repo}/commits/${head}/status`);
  if (status !== 200) throw new ForgeError(`GET check status answered ${status}`);
  const state = (body as { state?: unknown }).state;
  return state === "success" || state === "failure" ? state : "pending";
}

/** How an effect's HTTP answer maps: 2xx applied, a 4xx refusal rejected, anything else not known. */
function outcome(status: number, ok: number[] = [200]): "applied" | "rejected" | "indeterminate" {
  if (ok.includes(status)) return "applied";
  if (status >= 400 && status < 500) return "rejected";
  return "indeterminate";
}

type Ctx = ReconcileContext<Status>;
type PullRequest = Resource<Spec, Status>;

function status(resource: PullRequest, change: Partial<Status>): Status {
  return { ...resource.status.controllerStatus, ...change };
}

async function deletion(ctx: Ctx, resource: PullRequest): Promise<ReturnType<Ctx["settled"]>> {
  const { spec, metadata } = resource;
  if (!metadata.finalizers.includes(FINALIZER)) return ctx.settled();
  const unlabel = await ctx.effects.ensure({
    key: `unlabel:${spec.number}`,
    kind: "forge.label.remove",
    request: { repo: spec.repo, number: spec.number, label: LABEL },
    observe: async (signal) => ((await getPull(spec, signal)).labels.includes(LABEL) ? "not_applied" : "applied"),
    // 404: the label is not there (anymore): nothing left to remove.
    apply: async (signal) => outcome((await forge(spec, signal, "DELETE", `/repos/${spec.repo}/issues/${spec.number}/labels/${LABEL}`)).status, [200, 404]),
  });
  if (unlabel.state === "pending" || unlabel.state === "indeterminate") {
    return ctx.requeueAfter(5_000, { conditions: [conditionFalse("Ready", "Deleting", "removing the label from the pull request")] });
  }
  return ctx.settled({ finalizers: metadata.finalizers.filter((f) => f !== FINALIZER), conditions: [conditionFalse("Ready", "Deleted")] });
}

/** The merge of `head`: the same request on every pass until it is applied or rejected. */
async function merge(ctx: Ctx, resource: PullRequest, head: string): Promise<ReturnType<Ctx["settled"]>> {
  const { spec, metadata } = resource;
  const key = `merge:${spec.number}:${head}`;
  const method = spec.mergeMethod ?? "merge";
  const record = await ctx.effects.ensure({
    key,
    kind: "forge.merge",
    request: { repo: spec.repo, number: spec.number, head, method },
    // Before any retry: merged at this head is done; merged at another head is not ours to claim; open: not applied.
    observe: async (signal) => {
      const pull = await getPull(spec, signal);
      if (pull.merged) return pull.head === head ? "applied" : "indeterminate";
      return "not_applied";
    },
    apply: async (signal) => {
      const answer = await forge(spec, signal, "PUT", `/repos/${spec.repo}/pulls/${spec.number}/merge`, { sha: head, merge_method: method }, { "Idempotency-Key": `${metadata.uid}:${key}` });
      return outcome(answer.status);
    },
  });
  switch (record.state) {
    case "applied":
      return ctx.settled({
        controllerStatus: status(resource, { phase: "merged", head }),
        conditions: [conditionTrue("Merged", "Merged"), conditionTrue("ChecksPassed", "Success"), conditionTrue("Ready", "Merged")],
      });
    case "rejected":
      // Another head, or closed meanwhile: observe again from the start.
      return ctx.requeue({ controllerStatus: status(resource, { phase: "new", head }), conditions: [conditionFalse("Ready", "MergeRefused", "the forge refused the merge of the reviewed head")] });
    case "pending":
    case "indeterminate":
      return ctx.requeueAfter(5_000, { conditions: [conditionUnknown("Merged", "MergeUncertain", "the merge's outcome is not known yet: it is observed before any retry")] });
  }
}

export default defineController<Spec, Status>({
  name: "pull-request",
  timeoutMs: 30_000,
  initialStatus(spec) {
    if (spec === null || typeof spec !== "object") throw new Error("the spec must be {forge, repo, number}");
    if (typeof spec.forge !== "string" || !/^https?:\/\//.test(spec.forge)) throw new Error("spec.forge must be an http(s) URL");
    if (typeof spec.repo !== "string" || !/^[^/\s]+\/[^/\s]+$/.test(spec.repo)) throw new Error("spec.repo must be owner/name");
    if (!Number.isSafeInteger(spec.number) || spec.number <= 0) throw new Error("spec.number must be a positive integer");
    return { phase: "new" };
  },
  async reconcile(ctx, resource) {
    const { spec, metadata } = resource;
    const current = resource.status.controllerStatus;
    if (metadata.deletionTimestamp !== undefined) return deletion(ctx, resource);
    if (!metadata.finalizers.includes(FINALIZER)) {
      return ctx.requeue({ finalizers: [...metadata.finalizers, FINALIZER], conditions: [conditionUnknown("Ready", "Observing")] });
    }
    // A merge under way is settled first: its effect is observed before any retry.
    if (current.phase === "merging" && current.head !== undefined) return merge(ctx, resource, current.head);

    const pull = await getPull(spec, ctx.signal);
    if (pull.merged) {
      return ctx.settled({ controllerStatus: status(resource, { phase: "merged", head: pull.head }), conditions: [conditionTrue("Merged", "MergedElsewhere"), conditionTrue("Ready", "Merged")] });
    }
    if (pull.state === "closed") {
      return ctx.settled({ controllerStatus: status(resource, { phase: "closed", head: pull.head }), conditions: [conditionFalse("Merged", "Closed"), conditionFalse("Ready", "Closed")] });
    }
    if (current.label === undefined && !pull.labels.includes(LABEL)) {
      const label = await ctx.effects.ensure({
        key: `label:${spec.number}`,
        kind: "forge.label.add",
        request: { repo: spec.repo, number: spec.number, label: LABEL },
        observe: async (signal) => ((await getPull(spec, signal)).labels.includes(LABEL) ? "applied" : "not_applied"),
        apply: async (signal) => outcome((await forge(spec, signal, "POST", `/repos/${spec.repo}/issues/${spec.number}/labels`, { labels: [LABEL] })).status),
      });
      const done = label.state === "applied" || label.state === "rejected";
      return done ? ctx.requeue({ controllerStatus: status(resource, { label: label.state, head: pull.head }) }) : ctx.requeueAfter(5_000);
    }

    const requestKey = `review:${spec.number}:${pull.head}`;
    const review = await ctx.workflows.ensure({ requestKey, workflow: spec.reviewWorkflow ?? "pr-review", input: { repo: spec.repo, number: spec.number, head: pull.head, title: pull.title } });
    const workflowRun = { requestKey, runId: review.runId, state: review.state };
    const reviewing = (reason: string, message: string): StatusPatch<Status> => ({
      controllerStatus: status(resource, { phase: "reviewing", head: pull.head }),
      workflowRun,
      conditions: [conditionFalse("Ready", reason, message), conditionUnknown("ChecksPassed", "NotYet"), conditionFalse("Merged", "Open")],
    });
    switch (review.state) {
      case "running":
        return ctx.requeueAfter(10_000, reviewing("Reviewing", "the review workflow is running"));
      case "waiting":
        return ctx.requeueAfter(60_000, reviewing("ReviewWaiting", "the review workflow waits for a decision"));
      case "interrupted":
        // The next ensure starts a new attempt of the same request.
        return ctx.requeue(reviewing("Reviewing", "the review run was interrupted; starting it again"));
      case "failed":
        // A new head is a new review; poll for one.
        return ctx.requeueAfter(60_000, {
          controllerStatus: status(resource, { phase: "blocked", head: pull.head }),
          workflowRun,
          conditions: [conditionFalse("Ready", "ReviewFailed", "the review refused this head; push a new one")],
        });
      case "succeeded":
        break;
    }

    const checks = await getChecks(spec, ctx.signal, pull.head);
    if (checks === "pending") {
      return ctx.requeueAfter(5_000, {
        controllerStatus: status(resource, { phase: "waitingForChecks", head: pull.head }),
        workflowRun,
        conditions: [conditionUnknown("ChecksPassed", "Pending"), conditionFalse("Ready", "WaitingForChecks")],
      });
    }
    if (checks === "failure") {
      return ctx.requeueAfter(60_000, {
        controllerStatus: status(resource, { phase: "blocked", head: pull.head }),
        workflowRun,
        conditions: [conditionFalse("ChecksPassed", "Failed"), conditionFalse("Ready", "ChecksFailed")],
      });
    }
    // Record the head to merge before the merge effect: the next pass settles that effect first.
    return ctx.requeue({
      controllerStatus: status(resource, { phase: "merging", head: pull.head }),
      workflowRun,
      conditions: [conditionTrue("ChecksPassed", "Success"), conditionFalse("Ready", "Merging")],
    });
  },
});

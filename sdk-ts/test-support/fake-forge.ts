/**
 * A fake forge HTTP API on 127.0.0.1 for the pull-request controller
 * example (examples/controllers/pull-request.controller.ts): pull requests
 * with a head sha, labels and a combined check status, and a merge guarded
 * by the expected head sha and keyed by an `Idempotency-Key` header.
 * Every call is recorded (method, path, idempotency key, body).
 *
 * Routes (GitHub-shaped, trimmed to what the example uses):
 * - `GET  /repos/:owner/:repo/pulls/:n` → `{number, state, merged, head: {sha}, title, labels: [{name}], merge_commit_sha}`
 * - `GET  /repos/:owner/:repo/commits/:sha/status` → `{state: "pending" | "success" | "failure"}`
 * - `POST /repos/:owner/:repo/issues/:n/labels` `{labels: [name]}` → the labels
 * - `DELETE /repos/:owner/:repo/issues/:n/labels/:name` → the labels (404 when absent)
 * - `PUT  /repos/:owner/:repo/pulls/:n/merge` `{sha, merge_method}` + `Idempotency-Key`:
 *   a key seen before answers its first response again without merging;
 *   `sha` other than the head → 409; already merged or closed → 405;
 *   otherwise merged → 200 `{merged: true, sha}`.
 *
 * Fault injection: `dropNextMergeResponse` merges and then destroys the
 * connection without a response (the caller cannot know the merge
 * happened); `beforeMerge` runs just before a merge is decided (a test
 * moves the head there, as a push racing the merge would).
 */
import { type IncomingMessage, type Server, type ServerResponse, createServer } from "node:http";
import type { AddressInfo } from "node:net";

export interface FakePull {
  number: number;
  title: string;
  state: "open" | "closed";
  merged: boolean;
  head: string;
  labels: string[];
  mergeCommitSha: string | null;
}

export interface ForgeCall {
  method: string;
  path: string;
  idempotencyKey?: string;
  body?: unknown;
  status: number;
}

export class FakeForge {
  readonly calls: ForgeCall[] = [];
  /** Pull requests by `owner/repo#n`. */
  readonly pulls = new Map<string, FakePull>();
  /** Combined check status by head sha (absent: pending). */
  readonly checks = new Map<string, "pending" | "success" | "failure">();
  /** First responses of merges by idempotency key. */
  private readonly mergeResponses = new Map<string, { status: number; body: unknown }>();
  dropNextMergeResponse = false;
  beforeMerge: ((pull: FakePull) => void) | null = null;
  private mergeCount = 0;

  private constructor(
    private readonly server: Server,
    readonly url: string,
  ) {}

  static async start(): Promise<FakeForge> {
    let forge: FakeForge | undefined;
    const server = createServer((req, res) => {
      void forge?.handle(req, res);
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const { port } = server.address() as AddressInfo;
    forge = new FakeForge(server, `http://127.0.0.1:${port}`);
    return forge;
  }

  async stop(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  addPull(repo: string, pull: Omit<FakePull, "state" | "merged" | "labels" | "mergeCommitSha"> & Partial<FakePull>): FakePull {
    const full: FakePull = { state: "open", merged: false, labels: [], mergeCommitSha: null, ...pull };
    this.pulls.set(`${repo}#${pull.number}`, full);
    return full;
  }

  /** The recorded calls as `METHOD path` lines. */
  lines(): string[] {
    return this.calls.map((call) => `${call.method} ${call.path}`);
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    const text = Buffer.concat(chunks).toString("utf8");
    let body: unknown;
    try {
      body = text === "" ? undefined : JSON.parse(text);
    } catch {
      return this.send(req, res, 400, { message: "body is not JSON" }, undefined);
    }
    const path = new URL(req.url ?? "/", this.url).pathname;
    const method = req.method ?? "GET";
    const segments = path.split("/").filter((s) => s !== "").map(decodeURIComponent);
    const [root, owner, repo, kind, n, sub, extra] = segments;
    if (root !== "repos" || owner === undefined || repo === undefined) return this.send(req, res, 404, { message: "not found" }, body);
    const slug = `${owner}/${repo}`;
    if (kind === "commits" && sub === "status" && method === "GET" && n !== undefined && segments.length === 6) {
      return this.send(req, res, 200, { state: this.checks.get(n) ?? "pending" }, body);
    }
    const pull = this.pulls.get(`${slug}#${n}`);
    if (pull === undefined) return this.send(req, res, 404, { message: "no such pull request" }, body);
    if (kind === "pulls" && sub === undefined && method === "GET") return this.send(req, res, 200, view(pull), body);
    if (kind === "issues" && sub === "labels" && method === "POST" && extra === undefined) {
      const labels = (body as { labels?: unknown } | undefined)?.labels;
      if (!Array.isArray(labels) || !labels.every((l) => typeof l === "string")) return this.send(req, res, 422, { message: "labels must be strings" }, body);
      for (const label of labels) if (!pull.labels.includes(label)) pull.labels.push(label);
      return this.send(req, res, 200, pull.labels.map((name) => ({ name })), body);
    }
    if (kind === "issues" && sub === "labels" && method === "DELETE" && extra !== undefined) {
      if (!pull.labels.includes(extra)) return this.send(req, res, 404, { message: "label not on the pull request" }, body);
      pull.labels = pull.labels.filter((l) => l !== extra);
      return this.send(req, res, 200, pull.labels.map((name) => ({ name })), body);
    }
    if (kind === "pulls" && sub === "merge" && method === "PUT") return this.merge(req, res, pull, body);
    return this.send(req, res, 404, { message: "not found" }, body);
  }

  private merge(req: IncomingMessage, res: ServerResponse, pull: FakePull, body: unknown): void {
    const header = req.headers["idempotency-key"];
    const key = typeof header === "string" && header !== "" ? header : undefined;
    const earlier = key !== undefined ? this.mergeResponses.get(key) : undefined;
    if (earlier !== undefined) return this.send(req, res, earlier.status, earlier.body, body);
    this.beforeMerge?.(pull);
    const sha = (body as { sha?: unknown } | undefined)?.sha;
    let status: number;
    let answer: unknown;
    if (typeof sha !== "string") [status, answer] = [422, { message: "sha (the expected head) is required" }];
    else if (pull.merged || pull.state !== "open") [status, answer] = [405, { message: "pull request is not mergeable" }];
    else if (sha !== pull.head) [status, answer] = [409, { message: "head branch was modified; review and try the merge again" }];
    else {
      this.mergeCount += 1;
      pull.merged = true;
      pull.state = "closed";
      pull.mergeCommitSha = `merge-${this.mergeCount}-${pull.head}`;
      [status, answer] = [200, { merged: true, sha: pull.mergeCommitSha }];
    }
    if (key !== undefined) this.mergeResponses.set(key, { status, body: answer });
    if (status === 200 && this.dropNextMergeResponse) {
      this.dropNextMergeResponse = false;
      this.record(req, 0, body);
      req.socket.destroy();
      return;
    }
    this.send(req, res, status, answer, body);
  }

  private record(req: IncomingMessage, status: number, body: unknown): void {
    const header = req.headers["idempotency-key"];
    this.calls.push({
      method: req.method ?? "GET",
      path: new URL(req.url ?? "/", this.url).pathname,
      ...(typeof header === "string" ? { idempotencyKey: header } : {}),
      ...(body !== undefined ? { body } : {}),
      status,
    });
  }

  private send(req: IncomingMessage, res: ServerResponse, status: number, answer: unknown, body: unknown): void {
    this.record(req, status, body);
    res.writeHead(status, { "content-type": "application/json" });
    res.end(JSON.stringify(answer));
  }
}

function view(pull: FakePull): unknown {
  return {
    number: pull.number,
    title: pull.title,
    state: pull.state,
    merged: pull.merged,
    head: { sha: pull.head },
    labels: pull.labels.map((name) => ({ name })),
    merge_commit_sha: pull.mergeCommitSha,
  };
}

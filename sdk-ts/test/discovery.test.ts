/**
 * Workflow discovery against the shared fixtures
 * `protocol/fixtures/discovery/cases.json`, which the Rust server runs too
 * (`server/src/discovery.rs`): the discovered list, and that `run.start`'s
 * name resolution finds exactly the listed workflows.
 */
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, readFileSync, realpathSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, relative } from "node:path";
import { describe, it } from "node:test";
import { WorkflowNotFoundError, discoverWorkflows, resolveWorkflowRef } from "../src/runner/discovery.js";
import { REPO_DIR } from "../test-support/server.js";

type Entry = { file: string } | { dir: string } | { symlink: string; target: string };
interface Case {
  case: string;
  entries: Entry[];
  expected: { name: string; origin: string; path: string }[];
  notFound: string[];
}

const fixtures = JSON.parse(readFileSync(join(REPO_DIR, "protocol", "fixtures", "discovery", "cases.json"), "utf8")) as { cases: Case[] };

function build(root: string, entries: Entry[]): void {
  for (const entry of entries) {
    if ("file" in entry) {
      mkdirSync(dirname(join(root, entry.file)), { recursive: true });
      writeFileSync(join(root, entry.file), "");
    } else if ("dir" in entry) {
      mkdirSync(join(root, entry.dir), { recursive: true });
    } else {
      mkdirSync(dirname(join(root, entry.symlink)), { recursive: true });
      symlinkSync(entry.target, join(root, entry.symlink));
    }
  }
}

describe("discovery (shared fixtures)", () => {
  it("runs every case", () => {
    assert.ok(fixtures.cases.length >= 10);
  });
  for (const fixture of fixtures.cases) {
    it(fixture.case, async () => {
      const root = mkdtempSync(join(tmpdir(), "piw-discovery-"));
      try {
        build(root, fixture.entries);
        const projectPath = join(root, "project");
        const home = join(root, "home");
        const found = await discoverWorkflows(projectPath, home);
        assert.deepEqual(
          found.map((workflow) => ({ name: workflow.name, origin: workflow.origin, path: relative(root, workflow.ref) })),
          fixture.expected,
        );
        // run.start resolves a name to the listed file (through its links).
        for (const expected of fixture.expected) {
          const resolved = await resolveWorkflowRef(expected.name, { projectPath, home });
          assert.deepEqual(resolved, { kind: "file", path: realpathSync(join(root, expected.path)) }, expected.name);
        }
        for (const name of fixture.notFound) {
          await assert.rejects(resolveWorkflowRef(name, { projectPath, home }), WorkflowNotFoundError, `${JSON.stringify(name)} names no workflow`);
        }
      } finally {
        rmSync(root, { recursive: true, force: true });
      }
    });
  }
});

// Helper of scripts/conformance (run with the Node 22 from node_modules/node).
//
//   report.mjs baseline OUT EXPECTED REV LEG
//       prints the suite's --expected-failures YAML for one gateway leg: the scenarios the
//       direct leg failed at REV, plus this leg's entries in tests/conformance/expected-failures.yml.
//   report.mjs summary OUT EXPECTED "REV REV..." [SCENARIO,SCENARIO...]
//       reads every run's checks.json, writes OUT/summary.md and OUT/summary.json, prints
//       the verdict, exits 1 on an unexpected gateway failure or a stale expected entry.
//
// Scenario status, as the suite's --expected-failures judges it: "fail" when a check has
// status FAILURE, "warn" when one has WARNING (the suite's pass-rate ignores warnings, but
// its baseline counts them as failures, and so do we), "pass" when at least one check has
// SUCCESS, else "none" (no verdict: every check INFO or SKIPPED).
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const YAML = require('yaml');

const LEGS = ['direct', 'gateway-stdio', 'gateway-http'];
const GATEWAY_LEGS = ['gateway-stdio', 'gateway-http'];
const ROOT = path.resolve(path.dirname(new URL(import.meta.url).pathname), '../..');
const PKG = path.join(ROOT, 'node_modules/@modelcontextprotocol/conformance');

function fail(msg) {
  console.error(`conformance: ERROR: ${msg}`);
  process.exit(2);
}

// ---- tests/conformance/expected-failures.yml ----------------------------------------
// REV -> { gateway | gateway-stdio | gateway-http -> { "scenario" | "scenario:check-id" -> reason } }
function loadExpected(file) {
  const doc = YAML.parse(fs.readFileSync(file, 'utf8')) ?? {};
  const out = {}; // out[rev][leg][entry] = reason
  for (const [rev, legs] of Object.entries(doc)) {
    if (!/^\d{4}-\d{2}-\d{2}$/.test(rev)) fail(`${file}: top-level key '${rev}' is not a spec revision`);
    out[rev] = { 'gateway-stdio': {}, 'gateway-http': {} };
    for (const [leg, entries] of Object.entries(legs ?? {})) {
      const targets = leg === 'gateway' ? GATEWAY_LEGS : GATEWAY_LEGS.includes(leg) ? [leg] : null;
      if (!targets) fail(`${file}: ${rev}: leg '${leg}' is not one of gateway, gateway-stdio, gateway-http`);
      for (const [entry, reason] of Object.entries(entries ?? {})) {
        if (typeof reason !== 'string' || reason.trim() === '')
          fail(`${file}: ${rev}: ${leg}: '${entry}' needs a reason (a non-empty string)`);
        for (const t of targets) out[rev][t][entry] = reason.trim();
      }
    }
  }
  return out;
}

// ---- requirement sets shipped in the suite package ----------------------------------
function requirements(rev) {
  const file = path.join(PKG, 'requirements', `${rev}.yaml`);
  const req = new Map();
  if (!fs.existsSync(file)) return req;
  const doc = YAML.parse(fs.readFileSync(file, 'utf8'));
  for (const s of doc.server ?? []) req.set(s, 'required');
  for (const n of doc.not_scored ?? []) if (n.leg === 'server') req.set(n.scenario, `not scored (${n.reason})`);
  return req;
}

// ---- one leg's results ----------------------------------------------------------------
// Directory names are server-<scenario>-<ISO timestamp with - for : and .>.
const DIR_RE = /^server-(.+)-(\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}-\d{3}Z)$/;

function loadLeg(out, rev, leg) {
  const base = path.join(out, rev, leg);
  const results = new Map(); // scenario -> {status, checks, failed: [{id,msg}], ok, warn}
  const dir = path.join(base, 'results');
  if (!fs.existsSync(dir)) return null;
  for (const name of fs.readdirSync(dir).sort()) {
    const m = DIR_RE.exec(name);
    if (!m) continue;
    const file = path.join(dir, name, 'checks.json');
    let checks = [];
    try {
      checks = JSON.parse(fs.readFileSync(file, 'utf8'));
    } catch {
      results.set(m[1], { status: 'error', failed: [{ id: '-', msg: 'no readable checks.json' }], ok: 0, warn: 0 });
      continue;
    }
    const failed = checks.filter((c) => c.status === 'FAILURE' || c.status === 'WARNING').map((c) => ({
      status: c.status,
      id: c.id,
      msg: String(c.errorMessage ?? c.description ?? '').replace(/\s+/g, ' ').trim()
    }));
    const ok = checks.filter((c) => c.status === 'SUCCESS').length;
    const warn = checks.filter((c) => c.status === 'WARNING').length;
    const status = failed.length > warn ? 'fail' : warn ? 'warn' : ok ? 'pass' : 'none';
    results.set(m[1], { status, failed, ok, warn, passedIds: checks.filter((c) => c.status === 'SUCCESS').map((c) => c.id) });
  }
  // Scenarios the suite summarised but left no results for (crash, timeout).
  const log = path.join(base, 'suite.log');
  if (fs.existsSync(log)) {
    for (const line of fs.readFileSync(log, 'utf8').split('\n')) {
      const m = /^[✓✗] ([a-z0-9/_-]+): (\d+) passed, (\d+) failed/.exec(line);
      if (m && !results.has(m[1]))
        results.set(m[1], { status: Number(m[3]) ? 'error' : 'none', failed: [{ id: '-', msg: 'no results directory' }], ok: 0, warn: 0 });
    }
  }
  return results;
}

const isBad = (r) => r && (r.status === 'fail' || r.status === 'warn' || r.status === 'error');

// ---- baseline ---------------------------------------------------------------------------
function baseline(out, expectedFile, rev, leg) {
  const expected = loadExpected(expectedFile)[rev]?.[leg] ?? {};
  const direct = loadLeg(out, rev, 'direct') ?? new Map();
  const whole = new Set([...direct].filter(([, r]) => isBad(r)).map(([s]) => s));
  for (const e of Object.keys(expected)) if (!e.includes(':')) whole.add(e);
  const perCheck = Object.keys(expected).filter((e) => e.includes(':') && !whole.has(e.split(':')[0]));
  const list = [...whole, ...perCheck].sort();
  process.stdout.write(
    `# Generated by scripts/conformance for ${rev} ${leg}: direct-leg failures plus\n` +
      `# tests/conformance/expected-failures.yml. Do not edit.\nserver:${list.length ? '' : ' []'}\n` +
      list.map((s) => `  - ${JSON.stringify(s)}\n`).join('')
  );
}

// ---- summary ------------------------------------------------------------------------------
function cell(r, exp) {
  if (!r) return '–';
  if (r.status === 'pass') return `pass (${r.ok})`;
  if (r.status === 'none') return 'no checks';
  if (r.status === 'error') return exp ? 'error, expected' : '**ERROR**';
  const n = `${r.failed.length - r.warn}/${r.failed.length + r.ok}`;
  const w = r.warn ? `${r.status === 'fail' ? ', ' : ''}${r.warn} warn` : '';
  const what = r.status === 'fail' ? `fail ${n}${w}` : `pass (${r.ok}), ${w}`;
  return exp ? `${what}, expected` : `**${what}**`;
}

function summary(out, expectedFile, revs, filter) {
  const expected = loadExpected(expectedFile);
  const only = filter ? new Set(filter.split(',')) : null;
  const problems = [];
  const notes = [];
  const json = {};
  const suiteVersion = JSON.parse(fs.readFileSync(path.join(PKG, 'package.json'), 'utf8')).version;
  let md = `# Conformance results\n\n` +
    `\`@modelcontextprotocol/conformance@${suiteVersion}\` (\`server --suite all --spec-version REV\`) on Node ${process.version}, ` +
    `${new Date().toISOString()}. Fixture: \`tests/fixtures/conformance_server.py\` (Python SDK). ` +
    `Legs: **direct** = the fixture over HTTP; **gateway-stdio** / **gateway-http** = \`mcp-gateway serve\` ` +
    `fronting it over stdio / streamable HTTP with \`prefix = ""\`. Cells: \`pass (N)\` = N checks passed; \`fail F/T\` = F of T checks failed; \`W warn\` = warnings, which the suite's ` +
    `pass rate ignores but its expected-failures baseline (and this script) count as failures; \`expected\` = listed in ` +
    `tests/conformance/expected-failures.yml; \`no checks\` = no SUCCESS/FAILURE/WARNING check (nothing was verifiable).\n`;

  for (const rev of revs) {
    const req = requirements(rev);
    const legs = Object.fromEntries(LEGS.map((l) => [l, loadLeg(out, rev, l)]));
    if (!legs.direct) fail(`no results for ${rev} direct under ${out}`);
    const scenarios = [...new Set(LEGS.flatMap((l) => [...(legs[l]?.keys() ?? [])]))];
    const order = [...req.keys()];
    scenarios.sort((a, b) => {
      const ia = order.indexOf(a), ib = order.indexOf(b);
      return (ia < 0 ? 1e6 : ia) - (ib < 0 ? 1e6 : ib) || a.localeCompare(b);
    });
    const exp = expected[rev] ?? { 'gateway-stdio': {}, 'gateway-http': {} };
    json[rev] = {};
    const gaps = [];
    let md2 = `\n## ${rev}\n\n| scenario | requirement set | direct | gateway-stdio | gateway-http |\n|---|---|---|---|---|\n`;
    for (const s of scenarios) {
      const d = legs.direct?.get(s);
      const row = { requirement: req.get(s) ?? 'not in set' };
      const cells = [cell(d, false)];
      row.direct = d ?? null;
      for (const leg of GATEWAY_LEGS) {
        const r = legs[leg]?.get(s);
        row[leg] = r ?? null;
        const entries = exp[leg] ?? {};
        const wholeReason = entries[s];
        const checkEntries = Object.keys(entries).filter((e) => e.startsWith(`${s}:`));
        let expectedHere = false;
        if (isBad(r)) {
          const covered = wholeReason !== undefined ||
            (r.status !== 'error' && r.failed.every((f) => entries[`${s}:${f.id}`] !== undefined));
          expectedHere = covered;
          const reason = wholeReason ?? [...new Set(r.failed.map((f) => entries[`${s}:${f.id}`]).filter(Boolean))].join('; ');
          gaps.push({ leg, s, r, reason: covered ? reason : null, directFails: isBad(d) });
          if (!covered && !isBad(d))
            problems.push(`${rev} ${leg}: ${s} fails through the gateway but passes direct: ` +
              r.failed.slice(0, 2).map((f) => `${f.id}: ${f.msg.slice(0, 120)}`).join(' | ') +
              (r.failed.length > 2 ? ` | … ${r.failed.length - 2} more failing check(s)` : ''));
          if (covered && isBad(d))
            notes.push(`${rev} ${leg}: ${s}: expected-failures entry not needed, direct fails too`);
        } else if (r) {
          if (wholeReason !== undefined)
            problems.push(`${rev} ${leg}: ${s} is listed in expected-failures.yml but passes: remove the stale entry`);
          if (r.status === 'none' && d?.status === 'pass')
            notes.push(`${rev} ${leg}: ${s} gave no verdict through the gateway (no SUCCESS or FAILURE checks) but passes direct`);
        }
        if (r) {
          for (const e of checkEntries) {
            const id = e.slice(s.length + 1);
            if (!isBad(r) || (r.passedIds ?? []).includes(id))
              problems.push(`${rev} ${leg}: ${e} is listed in expected-failures.yml but passes: remove the stale entry`);
          }
        }
        cells.push(cell(r, expectedHere));
      }
      json[rev][s] = row;
      md2 += `| ${s} | ${row.requirement} | ${cells.join(' | ')} |\n`;
    }
    // Entries naming scenarios that did not run at all (typos, renamed scenarios).
    if (!only) {
      for (const leg of GATEWAY_LEGS)
        for (const e of Object.keys(exp[leg] ?? {}))
          if (!scenarios.includes(e.split(':')[0]))
            problems.push(`${rev} ${leg}: expected-failures.yml names '${e}', which the suite did not run`);
    }
    md += md2;
    if (gaps.length) {
      md += `\nFailing through the gateway at ${rev}:\n\n`;
      for (const g of gaps) {
        const why = g.directFails ? 'fails direct too' : g.reason ? `expected: ${g.reason}` : '**unexpected**';
        const first = g.r.failed.slice(0, 3).map((f) => `\`${f.id}\`${f.status === 'WARNING' ? ' (warning)' : ''}: ${f.msg.slice(0, 160)}`).join('; ');
        md += `- ${g.leg} \`${g.s}\` (${why}). ${first}${g.r.failed.length > 3 ? `; … ${g.r.failed.length - 3} more` : ''}\n`;
      }
    }
    for (const leg of LEGS) {
      const rcFile = path.join(out, rev, leg, 'suite.rc');
      if (!fs.existsSync(rcFile)) continue;
      const rc = Number(fs.readFileSync(rcFile, 'utf8'));
      json[rev][`_suite_exit_${leg}`] = rc;
      if (leg !== 'direct' && rc !== 0)
        notes.push(`${rev} ${leg}: the suite's own --expected-failures verdict was exit ${rc} (see ${path.join(rev, leg, 'suite.log')})`);
    }
  }

  md += `\n## Verdict\n\n` + (problems.length
    ? `**FAIL**: ${problems.length} problem(s):\n\n${problems.map((p) => `- ${p}`).join('\n')}\n`
    : `OK: every gateway failure of a scenario that passes direct is listed in tests/conformance/expected-failures.yml.\n`);
  if (notes.length) md += `\nNotes:\n\n${notes.map((n) => `- ${n}`).join('\n')}\n`;
  fs.writeFileSync(path.join(out, 'summary.md'), md);
  fs.writeFileSync(path.join(out, 'summary.json'), JSON.stringify({ problems, notes, results: json }, null, 2));
  for (const n of notes) console.log(`conformance: note: ${n}`);
  for (const p of problems) console.log(`conformance: PROBLEM: ${p}`);
  console.log(`conformance: ${problems.length ? 'FAIL' : 'OK'}; summary in ${path.relative(process.cwd(), path.join(out, 'summary.md'))}`);
  process.exit(problems.length ? 1 : 0);
}

const [mode, ...args] = process.argv.slice(2);
if (mode === 'baseline') baseline(...args);
else if (mode === 'summary') summary(args[0], args[1], args[2].split(/\s+/).filter(Boolean), args[3]);
else fail('usage: report.mjs baseline OUT EXPECTED REV LEG | summary OUT EXPECTED "REVS" [SCENARIOS]');

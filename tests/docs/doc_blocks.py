#!/usr/bin/python3
"""The command blocks of README.md and docs/*.md, checked and run as a new user would run them.

  doc_blocks.py check SRC                        classify every block; exit 1 on a violation
  doc_blocks.py run SRC SHARDTRAIN [DOC...]      check, then run the runnable blocks

The rules (docs/README of the convention: docs/getting-started.md has examples):
  * A command block is fenced ```bash, at any indentation (in a list item too). A plain ```
    block whose lines start like a command (build/bin/shardtrain, mpirun, sbatch, scripts/,
    jobscripts/, ...) is an error: it would escape this test.
  * A ```bash block runs as shown, from the repository, on a machine after `scripts/quickstart`
    (its run in runs/quickstart/), unless it says what it needs in a line `# needs: ...` (a
    cluster, a GPU, a downloaded model: the reader sees it, the test skips the block) or is
    preceded by `<!-- doc-test: skip (why) -->` (it runs as shown but is the set-up itself:
    scripts/quickstart, scripts/test, builds).
  * No block calls a bare `shardtrain` (it is not on PATH: build/bin/shardtrain).
  * Every inputs/, jobscripts/, scripts/ path named anywhere in the docs exists.

How the runnable blocks run: each document gets a fresh workspace holding what a checkout has
after the quickstart: inputs/, jobscripts/, scripts/, tests/, perf/ (links to the source), .data/
(links to the source's entries, so that a block may prepare a new dataset), runs/quickstart/ (a
copy of one real quickstart run: 60 steps, made once), and corpus/*.jsonl.gz (a small
stand-in for "your corpus"). Its build/bin/shardtrain runs the real binary with `train`'s
train.max_steps (given or from the deck) capped at 20, so a 120-step example trains 20 steps and
step files up to 20 keep their names; nothing else is changed. The blocks of a document run in
order in its workspace (`bash -e -o pipefail`; a variable a block assigns at the start of a line
is kept for the document's later blocks), mpirun with the environment's
equivalents of --bind-to none, --oversubscribe and (as root) --allow-run-as-root, which the docs
tell the reader to add.
"""
import gzip
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib

SUBCOMMANDS = r"(train|eval|generate|ckpt|data|deck|plan|info|maxbatch|bench|report)\b"
COMMAND_START = re.compile(r"^\s*(\$ )?(build/bin/shardtrain|shardtrain " + SUBCOMMANDS + r"|mpirun |srun |sbatch |"
                           r"scripts/|jobscripts/|tests/|cmake |sudo |export |/usr/bin/python3 )")
BARE = re.compile(r"(^|[\s;&|(])shardtrain\s+" + SUBCOMMANDS)
PATHS = re.compile(r"(?<![\w./-])((?:inputs|jobscripts|scripts)/[\w.+-]+(?:/[\w.+-]+)*)")
SKIP = re.compile(r"^<!--\s*doc-test:\s*skip\b.*-->\s*$")
NEEDS = re.compile(r"^\s*#\s*needs:\s*\S")
MAX_STEPS = 20  # the cap on train.max_steps


def documents(src):
    docs = [os.path.join(src, "README.md")]
    docs += sorted(os.path.join(src, "docs", f) for f in os.listdir(os.path.join(src, "docs")) if f.endswith(".md"))
    return docs


def blocks(path):
    """(line, info, body lines, skip reason or None) of every fenced block. A fence may be indented
    (a block inside a list item): its body loses that indentation, and the block is checked and run
    like any other, so that a command inside a list cannot escape the test."""
    lines = open(path, encoding="utf-8").read().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^( *)```(.*)$", lines[i])
        if not m:
            i += 1
            continue
        indent = len(m.group(1))
        j = i + 1
        while j < len(lines) and not lines[j].lstrip(" ").startswith("```"):
            j += 1
        body = [b[indent:] if b[:indent].strip() == "" else b.lstrip(" ") for b in lines[i + 1:j]]
        prev = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        out.append((i + 1, m.group(2).strip(), body, prev.strip() if SKIP.match(prev.strip()) else None))
        i = j + 1
    return out


def check(src):
    """Violations of the rules, as 'file:line: what' strings; and the runnable blocks per file."""
    errors, runnable = [], {}
    for doc in documents(src):
        rel = os.path.relpath(doc, src)
        text = open(doc, encoding="utf-8").read()
        for p in sorted(set(PATHS.findall(text))):
            p = p.rstrip(".")
            if not os.path.exists(os.path.join(src, p)):
                errors.append(f"{rel}: names {p}, which does not exist")
        for line, info, body, skip in blocks(doc):
            lang = info.split()[0] if info else ""
            if lang in ("", "text") and any(COMMAND_START.match(b) for b in body):
                errors.append(f"{rel}:{line}: a command block without ```bash (it escapes the docs test): "
                              f"{next(b for b in body if COMMAND_START.match(b)).strip()[:80]}")
                continue
            if lang not in ("bash", "sh", "shell", "console"):
                continue
            if lang != "bash":
                errors.append(f"{rel}:{line}: command blocks are ```bash, not ```{lang}")
            for b in body:
                if BARE.search(b) and not b.lstrip().startswith("#"):
                    errors.append(f"{rel}:{line}: bare `shardtrain` (not on PATH): build/bin/shardtrain: {b.strip()[:80]}")
            if skip or any(NEEDS.match(b) for b in body):
                continue
            runnable.setdefault(doc, []).append((line, "\n".join(body)))
    return errors, runnable


# The build/bin/shardtrain of a workspace: the real binary, `train`'s max_steps capped.
WRAPPER = r'''#!/usr/bin/python3
import os, re, sys, tomllib
REAL = {real!r}
CAP = {cap}
args = sys.argv[1:]
if args and args[0] == "train":
    steps = None
    for i, a in enumerate(args):
        m = re.match(r"^train\.max_steps=(\d+)$", a)
        if m:
            steps = int(m.group(1))
    deck = next((a for a in args[1:] if a.endswith(".toml") and os.path.isfile(a)), None)
    if steps is None and deck:
        with open(deck, "rb") as f:
            steps = tomllib.load(f).get("train", {{}}).get("max_steps")
    if isinstance(steps, int) and steps > CAP:
        args += ["--set", "train.max_steps=%d" % CAP]
os.execv(REAL, [REAL] + args)
'''


def corpus(dirname):
    """corpus/part-0.jsonl.gz, part-1.jsonl.gz: deterministic English-like rows ({"text": ...})."""
    os.makedirs(dirname)
    words = ("the of and to a in that it was her she not be his as had with for he you which they were "
             "this have all by at on but my so said would no what could there when been one very more").split()
    rng = random.Random(11)
    for part in range(2):
        with gzip.open(os.path.join(dirname, f"part-{part}.jsonl.gz"), "wt") as f:
            for _ in range(1500):
                s = " ".join(rng.choice(words) for _ in range(14))
                f.write('{"text": "%s."}\n' % (s[0].upper() + s[1:]))


def env_for(ws, shardtrain):
    e = dict(os.environ)
    e.update({
        "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "OMPI_MCA_hwloc_base_binding_policy": "none", "OMPI_MCA_rmaps_base_oversubscribe": "1",
        "SHARDTRAIN_BIN": os.path.join(ws, "build/bin/shardtrain"),
    })
    e.pop("OMPI_MCA_ess_singleton_isolated", None)
    return e


def run(cmd, cwd, env, log, timeout):
    """Runs a block with the variables earlier blocks of its document assigned (.doc-vars)."""
    names = sorted(set(re.findall(r"^([A-Za-z_][A-Za-z0-9_]*)=", cmd, re.M)))
    script = "[ -f .doc-vars ] && . ./.doc-vars\n" + cmd + "\n"
    if names:
        script += "declare -p " + " ".join(names) + " >> .doc-vars\n"
    with open(log, "a") as f:
        f.write(f"\n$ {cmd}\n")
        f.flush()
        return subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=cwd, env=env, stdout=f,
                              stderr=subprocess.STDOUT, timeout=timeout).returncode


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in ("check", "run"):
        sys.exit(__doc__)
    src = os.path.abspath(sys.argv[2])
    errors, runnable = check(src)
    for e in errors:
        print("FAIL:", e)
    if errors:
        sys.exit(1)
    n = sum(len(v) for v in runnable.values())
    print(f"docs: {n} runnable blocks in {len(runnable)} files; the rest say what they need or are the set-up")
    if sys.argv[1] == "check":
        return
    real = os.path.abspath(sys.argv[3])
    only = set(sys.argv[4:])
    top = tempfile.mkdtemp(prefix="shardtrain-docs-")
    keep = os.environ.get("KEEP_TMP") == "1"
    failed = []
    try:
        # One real quickstart run (its 60 steps), copied into every workspace.
        base = os.path.join(top, "base")
        os.makedirs(base)
        data = os.path.join(base, ".data")
        os.makedirs(data)
        src_data = os.path.realpath(os.path.join(src, ".data"))
        for name in os.listdir(src_data):
            os.symlink(os.path.join(src_data, name), os.path.join(data, name))
        e = env_for(base, real)
        log = os.path.join(top, "quickstart.log")
        t0 = time.time()
        steps = [] if os.path.exists(os.path.join(data, "austen-gpt2", "meta.json")) else \
            [f"{real} data prepare --source austen --tokenizer gpt2 --out .data/austen-gpt2"]
        steps.append(f"mpirun -np 2 {real} train {src}/inputs/quickstart.toml --set checkpoint.resume=never "
                     "--set checkpoint.previous_run=move_aside")
        for c in steps:
            if run(c, base, e, log, 1200) != 0:
                print(open(log).read()[-4000:])
                sys.exit("FAIL: the quickstart run itself failed")
        run(f"{real} report runs/quickstart", base, e, log, 300)  # plots; gnuplot may be missing
        print(f"quickstart run: {time.time() - t0:.0f} s", flush=True)
        for doc, items in runnable.items():
            rel = os.path.relpath(doc, src)
            if only and rel not in only:
                continue
            ws = os.path.join(top, rel.replace("/", "_"))
            os.makedirs(os.path.join(ws, "build", "bin"))
            for name in ("inputs", "jobscripts", "scripts", "tests", "perf", "docs", "README.md"):
                os.symlink(os.path.join(src, name), os.path.join(ws, name))
            os.makedirs(os.path.join(ws, ".data"))
            for name in os.listdir(data):
                os.symlink(os.path.realpath(os.path.join(data, name)), os.path.join(ws, ".data", name))
            shutil.copytree(os.path.join(base, "runs"), os.path.join(ws, "runs"), symlinks=True)
            corpus(os.path.join(ws, "corpus"))
            wrapper = os.path.join(ws, "build", "bin", "shardtrain")
            with open(wrapper, "w") as f:
                f.write(WRAPPER.format(real=real, cap=MAX_STEPS))
            os.chmod(wrapper, 0o755)
            log = os.path.join(top, rel.replace("/", "_") + ".log")
            for line, body in items:
                t0 = time.time()
                try:
                    rc = run(body, ws, env_for(ws, real), log, 900)
                except subprocess.TimeoutExpired:
                    rc = "timeout"
                took = time.time() - t0
                print(f"{rel}:{line}: {'ok' if rc == 0 else 'FAILED (' + str(rc) + ')'} in {took:.0f} s", flush=True)
                if rc != 0:
                    failed.append(f"{rel}:{line}")
                    print("\n".join(open(log).read().splitlines()[-30:]))
                    break  # the document's later blocks may build on this one
    finally:
        if keep:
            print("kept", top)
        else:
            shutil.rmtree(top, ignore_errors=True)
    if failed:
        sys.exit("FAIL: blocks that do not run as written: " + ", ".join(failed))
    print("docs: every runnable block ran")


if __name__ == "__main__":
    main()

"""Model exploration for groups of any size (pairs and the 3-way data), behind the "cap" and
"3-way" sections of docs/models.md. Splits are re-derived from seeds exactly as
`kace eval colocations` does (NumPy's permutation + the greedy n_occur rule), so any number of
seeds can be run: the paper's five seeds cannot tell models apart on the 3-way data, where one
seed's split decides the mean; a hundred seeds can.

Not part of the build or the tests: the shipped model is Rust (selector/src/slowdown.rs);
`kace eval colocations --seeds 1-100` reproduces the default's rows. Needs numpy, pandas,
scikit-learn:
    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install numpy pandas scikit-learn
    /tmp/venv/bin/python bench/models/explore_groups.py [ARTIFACT_DIR]   # ~5 min on 2 cores
"""
import sys

import numpy as np
import pandas as pd
from sklearn.linear_model import LinearRegression, Ridge
from sklearn.model_selection import train_test_split

D = (sys.argv[1] if len(sys.argv) > 1 else "../shared/data/kace-artifact").rstrip("/") + "/"
F = ["_Threads", "_Compute (SM) Throughput", "_DRAM Throughput", "_Memory Throughput",
     "_Registers", "_Static Shared Memory", "exclusive_throughput", "sm%", "mem%", "memcap"]
EXCL, SM_PCT, PCT = 6, 7, [7, 8]  # column indices: exclusive throughput; the % columns
L = lambda a: np.log1p(np.abs(a))


def load(name, k):
    """Profiles (n, k, 10), colocated throughputs (n, k), workload names (n, k)."""
    t = pd.read_csv(D + name)
    prof = np.stack([t[[f"w{i}{f}" for f in F]].to_numpy(float) for i in range(1, k + 1)], 1)
    thr = np.stack([t[f"w{i}throughput"].to_numpy(float) for i in range(1, k + 1)], 1)
    names = np.stack([t[f"workload{i}"].to_numpy() for i in range(1, k + 1)], 1)
    return prof, thr, names


def combine(p):
    """A set of jobs' combined profile: sums, means for the % columns (as the paper)."""
    x = p.sum(1)
    x[:, PCT] /= p.shape[1]
    return x


def partners(p, i):
    return combine(p[:, [j for j in range(p.shape[1]) if j != i]])


def split(names, seed, n_occur=3):
    """The greedy n_occur split over NumPy's permutation; self groups always go to test."""
    counts, train, test = {}, [], []
    for i in np.random.RandomState(seed).permutation(len(names)):
        ws = set(names[i])
        if len(ws) > 1 and any(counts.get(w, 0) < n_occur for w in ws):
            for w in ws:
                counts[w] = counts.get(w, 0) + 1
            train.append(i)
        else:
            test.append(i)
    return np.array(train), np.array(test)


class PaperLR:
    """The paper's model: OLS of the throughput sum on the combined profile."""

    def __init__(self, progress=False):
        self.progress = progress

    def fit(self, p, t, n):
        x = combine(p)
        self.m, self.s = x.mean(0), x.std(0, ddof=1)
        self.s[self.s == 0] = 1
        y = (t / p[:, :, EXCL] if self.progress else t).sum(1)
        self.r = LinearRegression().fit((x - self.m) / self.s, y)
        return self

    def pred(self, p, n, candidate_normalised=False, progress=False):
        x = combine(p)
        m, s = (x.mean(0), x.std(0, ddof=1)) if candidate_normalised else (self.m, self.s)
        s = np.where(s == 0, 1, s)
        return self.r.predict((x - m) / s)


FEATURES = {
    "log": lambda o, q, sat: [L(o), L(q)],
    "log+product": lambda o, q, sat: [L(o), L(q), L(o) * L(q)],
    "log+product+group": lambda o, q, sat: [L(o), L(q), L(o) * L(q), L(o + q)],
    "log+product+saturation": lambda o, q, sat: [L(o), L(q), L(o) * L(q), sat[:, None]],
}


class Slowdown:
    """kace's model: ridge on each job's log slowdown with per-workload sensitivity and
    pressure; a group's throughput sum is sum(exclusive * slowdown). `cap` bounds predicted
    slowdowns: a number, or "workload" for each workload's largest training ratio (at least
    1; 1 for a workload never seen); `clip` bounds the training ratios; `prior` adds
    -prior * ln max(1, sum of sm%/100) as a fixed physical offset (proportional sharing of a
    saturated GPU)."""

    def __init__(self, feat="log+product", alpha=1.0, scale=1.0, cap=np.inf, clip=np.inf,
                 weight=False, prior=0.0):
        self.feat, self.alpha, self.scale = FEATURES[feat], alpha, scale
        self.cap, self.clip, self.weight, self.prior = cap, clip, weight, prior

    def saturation(self, p):
        return np.log(np.maximum(1, p[:, :, SM_PCT].sum(1) / 100))

    def design(self, p, n):
        sat, out = self.saturation(p), []
        for i in range(p.shape[1]):
            x = (np.hstack(self.feat(p[:, i], partners(p, i), sat)) - self.m) / self.s
            terms = np.zeros((len(p), 2 * len(self.w)))
            for r in range(len(p)):
                if n[r, i] in self.w:
                    terms[r, self.w[n[r, i]]] = self.scale
                for j in range(p.shape[1]):
                    if j != i and n[r, j] in self.w:
                        terms[r, len(self.w) + self.w[n[r, j]]] += self.scale
            out.append(np.hstack([x, terms]))
        return out

    def fit(self, p, t, n):
        self.w = {w: i for i, w in enumerate(sorted(set(n.ravel())))}
        sat = self.saturation(p)
        raw = np.vstack([np.hstack(self.feat(p[:, i], partners(p, i), sat))
                         for i in range(p.shape[1])])
        self.m, self.s = raw.mean(0), raw.std(0)
        self.s[self.s == 0] = 1
        ratio = t / p[:, :, EXCL]
        self.ceiling = {w: max(1.0, ratio[n == w].max()) for w in self.w}
        y = np.log(np.minimum(ratio, self.clip)) + self.prior * sat[:, None]
        wt = p[:, :, EXCL].T.ravel() if self.weight else None
        self.r = Ridge(alpha=self.alpha).fit(np.vstack(self.design(p, n)), y.T.ravel(),
                                             sample_weight=wt)
        return self

    def slowdowns(self, p, n):
        logs = np.stack([self.r.predict(x) for x in self.design(p, n)], 1)
        cap = self.cap
        if cap == "workload":
            cap = np.vectorize(lambda w: self.ceiling.get(w, 1.0))(n)
        return np.minimum(cap, np.exp(logs - self.prior * self.saturation(p)[:, None]))

    def pred(self, p, n, candidate_normalised=False, progress=False):
        s = self.slowdowns(p, n)
        return (s if progress else s * p[:, :, EXCL]).sum(1)


def score(data, make, protocol, seeds, n_occur=3, progress=False):
    """Mean over (seed, target) of the picked group's objective / the best candidate's: the
    throughput sum, or with `progress` the normalised progress (sum of colocated / exclusive)."""
    p, t, n = data
    total, out = (t / p[:, :, EXCL] if progress else t).sum(1), []
    for seed in seeds:
        train, test = split(n, seed, n_occur)
        if protocol == "paper":  # the artifact trainer's inner 80 % split
            train = train[train_test_split(np.arange(len(train)), test_size=0.2,
                                           random_state=30)[0]]
        model = make().fit(p[train], t[train], n[train])
        for w in sorted(set(n.ravel())):
            c = np.array([i for i in test if w in n[i]])
            if len(c) < 2:
                continue
            guess = model.pred(p[c], n[c], candidate_normalised=protocol == "paper",
                               progress=progress)
            out.append(total[c][np.argmax(guess)] / total[c].max())
    return np.mean(out)


def unseen(pairs, make):
    """The held-out-workload experiment with the artifact's splits (production protocol)."""
    p, t, n = pairs
    key = {}
    for r, (a, b) in enumerate(n):
        key[(a, b)] = r
        key.setdefault((b, a), r)
    u, out = pd.read_csv(D + "splits/unseen_workload_splits.csv"), []
    for w, s in u.groupby("heldout_workload"):
        rows = lambda d: np.array([key[(a, b)] for a, b in zip(d.workload1, d.workload2)])
        train = rows(s[s.split == "train"].sort_values("row_in_file"))
        test = rows(s[s.split == "test"].sort_values("row_in_file"))
        c = np.array([i for i in test if n[i, 0].startswith(w) or n[i, 1].startswith(w)])
        if len(c) < 2:
            continue
        guess = make().fit(p[train], t[train], n[train]).pred(p[c], n[c])
        out.append(t[c].sum(1)[np.argmax(guess)] / t[c].sum(1).max())
    return np.mean(out)


VARIANTS = [
    ("paper LR", PaperLR),
    ("slowdown, no ceiling (old default)", Slowdown),
    ("slowdown, workload ceilings (default)", lambda: Slowdown(cap="workload")),
    ("  ... flat cap at 1", lambda: Slowdown(cap=1.0)),
    ("  ... flat cap at 1, training ratios clipped at 1", lambda: Slowdown(cap=1.0, clip=1.0)),
    ("  ... flat cap at 1.05", lambda: Slowdown(cap=1.05)),
    ("  ... alpha 0.5", lambda: Slowdown(alpha=0.5, cap="workload")),
    ("  ... alpha 2", lambda: Slowdown(alpha=2.0, cap="workload")),
    ("  ... workload scale 2", lambda: Slowdown(scale=2.0, cap="workload")),
    ("  ... log features only", lambda: Slowdown("log", cap="workload")),
    ("  ... + group features", lambda: Slowdown("log+product+group", cap="workload")),
    ("  ... + saturation feature", lambda: Slowdown("log+product+saturation", cap="workload")),
    ("  ... weighted by exclusive thr.", lambda: Slowdown(cap="workload", weight=True)),
    ("  ... sm% saturation prior, alpha 3", lambda: Slowdown(alpha=3.0, cap="workload", prior=1.0)),
]

PAIRS = load("pairs/MPS100_kernel_labels_targetMPS100.csv", 2)
TRIPLES = load("multiinstance/total_labels_batch2-8_targetMPS100.csv", 3)
FIVE, HUNDRED = (10, 20, 30, 40, 50), range(1, 101)
COLUMNS = [
    ("pairs 10-50 prod", lambda m: score(PAIRS, m, "production", FIVE)),
    ("unseen prod", lambda m: unseen(PAIRS, m)),
    ("pairs 1-100 prod", lambda m: score(PAIRS, m, "production", HUNDRED)),
    ("pairs 1-100 paper", lambda m: score(PAIRS, m, "paper", HUNDRED)),
    ("3-way 10-50 prod", lambda m: score(TRIPLES, m, "production", FIVE)),
    ("3-way 10-50 paper", lambda m: score(TRIPLES, m, "paper", FIVE)),
    ("3-way 1-100 prod", lambda m: score(TRIPLES, m, "production", HUNDRED)),
    ("3-way 1-100 paper", lambda m: score(TRIPLES, m, "paper", HUNDRED)),
    ("progress 10-50 prod", lambda m: score(PAIRS, progress_model(m), "production", FIVE,
                                            progress=True)),
    ("progress 1-100 prod", lambda m: score(PAIRS, progress_model(m), "production", HUNDRED,
                                             progress=True)),
]


def progress_model(make):
    """The paper's model is refitted to the normalised-progress target; kace's serves both."""
    return (lambda: PaperLR(progress=True)) if make is PaperLR else make

print("| variant | " + " | ".join(c for c, _ in COLUMNS) + " |")
print("|---" * (len(COLUMNS) + 1) + "|")
for name, make in VARIANTS:
    print(f"| {name} | " + " | ".join(f"{f(make):.4f}" for _, f in COLUMNS) + " |", flush=True)

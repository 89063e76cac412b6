"""Model exploration behind docs/models.md: the variants tried for kace's default model,
scored with kace's production protocol on the KACE artifact (n_occur splits, seeds 10-50,
and the unseen-workload experiment).

Not part of the build or the tests: the shipped model is Rust (selector/src/slowdown.rs) and
`kace eval paper` reproduces its numbers. Needs numpy, pandas and scikit-learn:
    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install numpy pandas scikit-learn
    /tmp/venv/bin/python bench/models/explore.py [ARTIFACT_DIR]
"""
import sys

import numpy as np
import pandas as pd
from sklearn.linear_model import LinearRegression, Ridge

D = (sys.argv[1] if len(sys.argv) > 1 else "../shared/data/kace-artifact").rstrip("/") + "/"
P = pd.read_csv(D + "pairs/MPS100_kernel_labels_targetMPS100.csv")
S = pd.read_csv(D + "splits/n_occur_splits.csv")
U = pd.read_csv(D + "splits/unseen_workload_splits.csv")
F = ["_Threads", "_Compute (SM) Throughput", "_DRAM Throughput", "_Memory Throughput",
     "_Registers", "_Static Shared Memory", "exclusive_throughput", "sm%", "mem%", "memcap"]
J1 = P[[f"w1{f}" for f in F]].to_numpy(float)
J2 = P[[f"w2{f}" for f in F]].to_numpy(float)
T1, T2 = P.w1throughput.to_numpy(float), P.w2throughput.to_numpy(float)
N1, N2 = P.workload1.to_numpy(), P.workload2.to_numpy()
KEY = {(a, b): k for k, (a, b) in enumerate(zip(N1, N2))}
W = sorted(set(N1) | set(N2))
L = lambda a: np.log1p(np.abs(a))


def pair_features(a, b):
    x = a + b
    x[:, 7:9] /= 2  # sm%, mem% are averaged
    return x


class PairLR:
    """The paper's model, with training-data normalisation (production protocol)."""

    def __init__(self, alpha=0.0):
        self.alpha = alpha

    def fit(self, idx):
        X = pair_features(J1[idx], J2[idx])
        self.m, self.s = X.mean(0), X.std(0, ddof=1)
        self.s[self.s == 0] = 1
        reg = Ridge(alpha=self.alpha) if self.alpha else LinearRegression()
        self.r = reg.fit((X - self.m) / self.s, T1[idx] + T2[idx])
        return self

    def pred(self, idx):
        return self.r.predict((pair_features(J1[idx], J2[idx]) - self.m) / self.s)


FEATURES = {
    "raw": lambda o, p: np.hstack([o, p]),
    "log": lambda o, p: np.hstack([L(o), L(p)]),
    "log+product": lambda o, p: np.hstack([L(o), L(p), L(o) * L(p)]),
    "log+product+sum": lambda o, p: np.hstack([L(o), L(p), L(o) * L(p), L(o + p)]),
}


class Slowdown:
    """Per-job slowdown: target ratio or log ratio; optional per-workload terms."""

    def __init__(self, feat, alpha=1.0, workload_scale=0.0, log_target=True, weight=False,
                 ceiling=False):
        self.feat, self.alpha, self.lam = FEATURES[feat], alpha, workload_scale
        self.log_target, self.weight, self.ceiling = log_target, weight, ceiling

    def design(self, own, oth, on, pn):
        X = (self.feat(own, oth) - self.m) / self.s
        if not self.lam:
            return X
        O = np.zeros((len(on), 2 * len(self.W)))
        for i, (a, b) in enumerate(zip(on, pn)):
            if a in self.W:
                O[i, self.W[a]] = self.lam
            if b in self.W:
                O[i, len(self.W) + self.W[b]] = self.lam
        return np.hstack([X, O])

    def fit(self, idx):
        own, oth = np.vstack([J1[idx], J2[idx]]), np.vstack([J2[idx], J1[idx]])
        on, pn = np.concatenate([N1[idx], N2[idx]]), np.concatenate([N2[idx], N1[idx]])
        self.W = {w: i for i, w in enumerate(sorted(set(on)))}
        X0 = self.feat(own, oth)
        self.m, self.s = X0.mean(0), X0.std(0)
        self.s[self.s < 1e-12] = 1
        e, t = own[:, 6], np.concatenate([T1[idx], T2[idx]])
        y = np.log(t / e) if self.log_target else t / e
        # A workload's ceiling: its largest measured ratio, at least 1 (bench/models/
        # explore_groups.py compares it with flat caps).
        self.top = {w: max(1.0, (t / e)[on == w].max()) for w in self.W}
        self.r = Ridge(alpha=self.alpha).fit(self.design(own, oth, on, pn), y,
                                             sample_weight=e if self.weight else None)
        return self

    def job(self, own, oth, on, pn):
        y = self.r.predict(self.design(own, oth, on, pn))
        y = np.exp(y) if self.log_target else y
        if self.ceiling:
            y = np.minimum(y, [self.top.get(w, 1.0) for w in on])
        return y

    def pred(self, idx):
        return (self.job(J1[idx], J2[idx], N1[idx], N2[idx]) * J1[idx, 6]
                + self.job(J2[idx], J1[idx], N2[idx], N1[idx]) * J2[idx, 6])


class Blend:
    def __init__(self, w):
        self.w = w

    def fit(self, idx):
        self.a = Slowdown("log+product", 1.0, 1.0).fit(idx)
        self.b = PairLR().fit(idx)
        return self

    def pred(self, idx):
        return self.w * self.a.pred(idx) + (1 - self.w) * self.b.pred(idx)


def choose(model, test, targets):
    out = []
    for w in targets:
        c = np.array([i for i in test if w in (N1[i], N2[i])])
        if len(c) < 2:
            continue
        act = T1[c] + T2[c]
        out.append(act[np.argmax(model.pred(c))] / act.max())
    return out


def curve(make, n):
    res = []
    for seed in (10, 20, 30, 40, 50):
        s = S[(S.n_occur == n) & (S.seed == seed)]
        tr = s[s.split == "train"].sort_values("row_in_file")
        te = s[s.split == "test"].sort_values("row_in_file")
        tri = np.array([KEY[(a, b)] for a, b in zip(tr.workload1, tr.workload2)])
        tei = [KEY[(a, b)] for a, b in zip(te.workload1, te.workload2)]
        res += choose(make().fit(tri), tei, W)
    return np.mean(res)


def unseen(make):
    res = []
    for w in W:
        s = U[U.heldout_workload == w]
        idx = lambda d: np.array([KEY.get((a, b), KEY.get((b, a)))
                                  for a, b in zip(d.workload1, d.workload2)])
        tr = idx(s[s.split == "train"].sort_values("row_in_file"))
        te = idx(s[s.split == "test"].sort_values("row_in_file"))
        res += choose(make().fit(tr), te, [w])
    return np.mean(res)


VARIANTS = [
    ("paper LR (production protocol)", lambda: PairLR()),
    ("ridge on pair features (alpha 1)", lambda: PairLR(1.0)),
    ("slowdown ratio, raw features", lambda: Slowdown("raw", 1.0, log_target=False)),
    ("slowdown ratio, log features", lambda: Slowdown("log", 1.0, log_target=False)),
    ("log slowdown, log features", lambda: Slowdown("log", 1.0)),
    ("log slowdown, log + product", lambda: Slowdown("log+product", 1.0)),
    ("  ... weighted by exclusive thr.", lambda: Slowdown("log+product", 1.0, weight=True)),
    ("log slowdown, log + product + sum", lambda: Slowdown("log+product+sum", 3.0)),
    ("+ workload terms, log (a=1, s=1)", lambda: Slowdown("log", 1.0, 1.0)),
    ("+ workload terms, log+product", lambda: Slowdown("log+product", 1.0, 1.0)),
    ("  ... workload ceilings (default)", lambda: Slowdown("log+product", 1.0, 1.0, ceiling=True)),
    ("  ... a=0.3, s=1", lambda: Slowdown("log+product", 0.3, 1.0)),
    ("  ... a=1, s=3", lambda: Slowdown("log+product", 1.0, 3.0)),
    ("  ... a=3, s=1", lambda: Slowdown("log+product", 3.0, 1.0)),
    ("+ workload terms, log+product+sum", lambda: Slowdown("log+product+sum", 1.0, 1.0)),
    ("blend 0.5 default + 0.5 paper LR", lambda: Blend(0.5)),
]

print(f"{'variant':42s} {'n_occur=3':>9s} {'unseen':>7s}  n_occur 2..10")
for name, make in VARIANTS:
    c = [curve(make, n) for n in range(2, 11)]
    print(f"{name:42s} {c[1]:9.4f} {unseen(make):7.4f}  " + " ".join(f"{v:.3f}" for v in c))

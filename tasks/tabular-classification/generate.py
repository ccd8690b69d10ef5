"""Generate the synthetic customer-churn dataset of the tabular-classification task.

Deterministic (fixed seed). Writes data/train.csv (with labels), data/test.csv (without) and
secret/test_labels.csv. Run from the task directory: python generate.py
With --hidden OUT (air, per host, see _lib/air_draw.py): only the test split, drawn from
$AIR_HIDDEN_SEED (the test rows of a whole draw), under the public test ids.
"""
import os
import sys

import numpy as np
import pandas as pd

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "_lib")]
from air_draw import Target  # noqa: E402
SEED = 4_2024_07
N_TRAIN, N_TEST = 4000, 2000
INTERCEPT = 0.5


def make(n, rng):
    age = rng.integers(18, 81, n)
    tenure = np.minimum(rng.exponential(30, n).astype(int), 120)
    plan = rng.choice(["basic", "standard", "premium", "family"], n, p=[0.35, 0.3, 0.2, 0.15])
    region = rng.choice(["north", "south", "east", "west", "central"], n, p=[0.25, 0.2, 0.2, 0.2, 0.15])
    device = rng.choice(["android", "ios", "web"], n, p=[0.45, 0.35, 0.2])
    payment = rng.choice(["card", "bank_transfer", "voucher"], n, p=[0.5, 0.35, 0.15])
    income = np.round(np.exp(rng.normal(3.7, 0.55, n)) + 0.3 * age, 1)  # thousands per year
    usage = np.round(rng.gamma(2.0, 12.0, n) * np.where(plan == "premium", 1.6, 1.0), 2)
    support_calls = rng.poisson(1.3 + 0.6 * (device == "web"), n)
    satisfaction = np.clip(np.round(rng.normal(3.4, 1.1, n) - 0.35 * support_calls), 1, 5)
    last_login_days = np.round(rng.exponential(9, n), 1)
    discount = np.round(rng.choice([0, 0, 0, 0.05, 0.1, 0.2], n) + rng.uniform(0, 0.02, n), 3)
    monthly_fee = np.round(
        pd.Series(plan).map({"basic": 15, "standard": 28, "premium": 55, "family": 48}).to_numpy()
        * (1 - discount) + rng.normal(0, 2, n), 2)
    noise_a = np.round(rng.normal(0, 1, n), 3)
    noise_b = rng.integers(0, 1000, n)

    # latent churn score: thresholds, interactions and a periodic age effect
    f = (INTERCEPT
         + 1.4 * (support_calls >= 3) + 0.5 * (support_calls >= 5)
         + 1.1 * (satisfaction <= 2) - 0.6 * (satisfaction >= 5)
         + 1.9 * ((plan == "premium") & (tenure < 12))
         - 0.9 * np.log1p(tenure) / np.log(121) * 2
         + 0.9 * np.sin(age / 6.0)
         + 1.6 * ((income < 40) & np.isin(plan, ["premium", "family"]))
         + 0.5 * (region == "south") - 0.5 * (region == "central")
         + 0.9 * np.tanh((last_login_days - 12) / 8)
         - 1.2 * ((device == "ios") & (usage > 40))
         + 0.9 * ((payment == "voucher") & (discount < 0.04))
         + 0.04 * (monthly_fee - 30) * (region == "west"))
    label = (rng.random(n) < 1 / (1 + np.exp(-2.2 * f))).astype(int)

    df = pd.DataFrame({
        "age": age, "income_k": income, "tenure_months": tenure, "plan": plan, "region": region,
        "device": device, "payment": payment, "monthly_fee": monthly_fee, "discount": discount,
        "usage_gb": usage, "support_calls": support_calls, "satisfaction": satisfaction,
        "last_login_days": last_login_days, "feature_x": noise_a, "feature_y": noise_b,
    })
    # missing values: MCAR in some columns, informative missingness for satisfaction
    df.loc[rng.random(n) < 0.08, "income_k"] = np.nan
    df.loc[rng.random(n) < 0.04, "region"] = np.nan
    df.loc[rng.random(n) < 0.05, "usage_gb"] = np.nan
    miss_sat = rng.random(n) < np.where(label == 1, 0.18, 0.06)
    df.loc[miss_sat, "satisfaction"] = np.nan
    return df, label


def draw(seed):
    rng = np.random.default_rng(seed)
    df, label = make(N_TRAIN + N_TEST, rng)
    return df, label, rng.permutation(N_TRAIN + N_TEST) + 100000


def main():
    out = Target(HERE, SEED)
    df, label, ids = draw(SEED)
    if out.hidden:  # new rows under the public split's test ids, which no training row has
        df, label, _ = draw(out.seed)
    df.insert(0, "id", ids)
    train = df.iloc[:N_TRAIN].copy()
    train["label"] = label[:N_TRAIN]
    test = df.iloc[N_TRAIN:].reset_index(drop=True)
    test_labels = pd.DataFrame({"id": test["id"], "label": label[N_TRAIN:]})
    if not out.hidden:
        train.to_csv(out.path("data", "train.csv"), index=False)
    test.to_csv(out.path("data", "test.csv"), index=False)
    test_labels.to_csv(out.path("secret", "test_labels.csv"), index=False)
    print(f"train {train.shape}, test {test.shape}, positive rate {label.mean():.3f}")


if __name__ == "__main__":
    main()

"""Generate the synthetic house-price dataset of the regression-rmse task.

Deterministic (fixed seed). Writes data/train.csv (with the target `price`), data/test.csv
(without) and secret/test_targets.csv. Run from the task directory: python generate.py
With --hidden OUT (air, per host, see _lib/air_draw.py): only the test split, drawn from
$AIR_HIDDEN_SEED: the test rows of a whole draw, so they follow the same distribution.
"""
import os
import sys

import numpy as np
import pandas as pd

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "_lib")]
from air_draw import Target  # noqa: E402
SEED = 9_2024_11
N_TRAIN, N_TEST = 3000, 1500

NEIGHBOURHOODS = {  # name: (price multiplier, centre x, centre y)
    "old_town": (1.45, 0.0, 0.0), "riverside": (1.30, 2.0, -1.0), "harbour": (1.20, -3.0, 1.5),
    "university": (1.05, 1.0, 3.0), "midtown": (1.00, -1.0, -2.5), "eastfield": (0.85, 5.0, 1.0),
    "hillcrest": (1.15, -4.5, -3.5), "industrial": (0.70, 4.0, -4.0),
}


def make(n, rng):
    names = list(NEIGHBOURHOODS)
    hood = rng.choice(names, n, p=[0.1, 0.12, 0.1, 0.14, 0.18, 0.14, 0.1, 0.12])
    mult = np.array([NEIGHBOURHOODS[h][0] for h in hood])
    cx = np.array([NEIGHBOURHOODS[h][1] for h in hood])
    cy = np.array([NEIGHBOURHOODS[h][2] for h in hood])
    x = np.round(cx + rng.normal(0, 1.0, n), 3)
    y = np.round(cy + rng.normal(0, 1.0, n), 3)
    bedrooms = rng.integers(1, 7, n)
    sqft = np.round(rng.normal(500 + 330 * bedrooms, 180, n).clip(300, None))
    bathrooms = np.clip(np.round(bedrooms * rng.uniform(0.4, 0.9, n) * 2) / 2, 1, None)
    year_built = rng.integers(1900, 2024, n)
    lot_sqft = np.round(np.exp(rng.normal(8.4, 0.6, n)) * np.where(np.isin(hood, ["old_town", "midtown"]), 0.5, 1.0))
    condition = rng.choice(["poor", "fair", "good", "excellent"], n, p=[0.1, 0.3, 0.45, 0.15])
    garage = rng.integers(0, 2, n) * rng.integers(1, 3, n)  # 0, 1 or 2 cars
    renovated = (rng.random(n) < np.where(year_built < 1970, 0.45, 0.1)).astype(int)
    dist_centre = np.sqrt(x ** 2 + y ** 2)

    cond = pd.Series(condition).map({"poor": 0.78, "fair": 0.93, "good": 1.0, "excellent": 1.12}).to_numpy()
    age = 2024 - year_built
    age_effect = np.where(renovated == 1, 1.0, 1.0 - 0.35 * np.sin(np.pi * np.clip(age, 0, 100) / 100))
    vintage = 1 + 0.18 * (year_built < 1930)  # pre-war houses are sought after
    base = (95 + 0.21 * sqft ** 0.97 + 16 * bathrooms + 9 * np.log(lot_sqft) + 14 * garage
            + 40 * np.exp(-dist_centre / 2.5))
    price = base * mult * cond * age_effect * vintage
    price *= np.exp(rng.normal(0, 0.09, n))  # multiplicative noise
    price = np.round(price, 1)  # thousands

    df = pd.DataFrame({
        "neighbourhood": hood, "x_km": x, "y_km": y, "sqft": sqft, "bedrooms": bedrooms,
        "bathrooms": bathrooms, "lot_sqft": lot_sqft, "year_built": year_built,
        "renovated": renovated, "condition": condition, "garage_cars": garage,
    })
    df.loc[rng.random(n) < 0.06, "lot_sqft"] = np.nan
    df.loc[rng.random(n) < 0.05, "garage_cars"] = np.nan
    df.loc[rng.random(n) < 0.03, "condition"] = np.nan
    return df, price


def main():
    out = Target(HERE, SEED)
    rng = np.random.default_rng(out.seed)
    df, price = make(N_TRAIN + N_TEST, rng)
    df.insert(0, "id", np.arange(N_TRAIN + N_TEST) + 1)
    train = df.iloc[:N_TRAIN].copy()
    train["price"] = price[:N_TRAIN]
    test = df.iloc[N_TRAIN:].reset_index(drop=True)
    targets = pd.DataFrame({"id": test["id"], "price": price[N_TRAIN:]})
    if not out.hidden:
        train.to_csv(out.path("data", "train.csv"), index=False)
    test.to_csv(out.path("data", "test.csv"), index=False)
    targets.to_csv(out.path("secret", "test_targets.csv"), index=False)
    print(f"train {train.shape}, test {test.shape}, price mean {price.mean():.1f} sd {price.std():.1f}")


if __name__ == "__main__":
    main()

"""Baseline for the regression-rmse task.

Ordinary least squares on the numeric columns only (mean-imputed); the categorical columns are
ignored. Writes submission.csv with columns id,price.
Usage: python train.py
"""
import os

import numpy as np
import pandas as pd
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LinearRegression
from sklearn.model_selection import cross_val_score
from sklearn.pipeline import make_pipeline

DATA = os.environ.get("DATA_DIR", "data")

train = pd.read_csv(os.path.join(DATA, "train.csv"))
test = pd.read_csv(os.path.join(DATA, "test.csv"))

features = [c for c in train.columns
            if c not in ("id", "price") and pd.api.types.is_numeric_dtype(train[c])]
model = make_pipeline(SimpleImputer(strategy="mean"), LinearRegression())

cv = cross_val_score(model, train[features], train["price"], cv=5, scoring="neg_root_mean_squared_error")
print(f"5-fold CV RMSE: {-cv.mean():.2f} (+/- {cv.std():.2f})")

model.fit(train[features], train["price"])
pred = model.predict(test[features])
pd.DataFrame({"id": test["id"], "price": np.round(pred, 3)}).to_csv("submission.csv", index=False)
print("wrote submission.csv")

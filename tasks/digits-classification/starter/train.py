"""Baseline for the digits-classification task.

Multinomial logistic regression on the raw 16x16 pixels. Writes submission.csv (id,label) where
id is the row index of the image in data/test_images.npy.
Usage: python train.py
"""
import os

import numpy as np
import pandas as pd
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split

DATA = os.environ.get("DATA_DIR", "data")

x_train = np.load(os.path.join(DATA, "train_images.npy")).astype(np.float32) / 255.0
y_train = np.load(os.path.join(DATA, "train_labels.npy"))
x_test = np.load(os.path.join(DATA, "test_images.npy")).astype(np.float32) / 255.0
flat = lambda x: x.reshape(len(x), -1)  # noqa: E731

# hold-out estimate
xa, xb, ya, yb = train_test_split(flat(x_train), y_train, test_size=0.2, random_state=0, stratify=y_train)
holdout = LogisticRegression(max_iter=2000).fit(xa, ya)
print(f"hold-out accuracy: {holdout.score(xb, yb):.4f}")

model = LogisticRegression(max_iter=2000).fit(flat(x_train), y_train)
pred = model.predict(flat(x_test))
pd.DataFrame({"id": np.arange(len(x_test)), "label": pred}).to_csv("submission.csv", index=False)
print("wrote submission.csv")

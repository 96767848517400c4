"""scikit-learn's MLPClassifier on the arrays benchmarks/peers.py prepared: the one-process baseline.

Same model shape, Adam with the same learning rate and batch size, no L2 penalty (alpha = 0, as
shoal adds none), and every epoch run: max_iter = epochs with tol = 0 and a patience longer than
the run. scikit-learn reports no per-epoch times, so seconds per epoch = fit seconds / n_iter_.
BLAS threads are capped with threadpoolctl (`--threads`) and the count it ran with is recorded.
"""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path

from sklearn.exceptions import ConvergenceWarning
from sklearn.neural_network import MLPClassifier
from threadpoolctl import threadpool_info, threadpool_limits

from benchmarks.peer_arguments import load_arrays, peer_parser

ACTIVATIONS = {"relu": "relu", "sigmoid": "logistic", "tanh": "tanh"}


def main(argv: list[str] | None = None) -> None:
    parser = peer_parser(__doc__)
    parser.add_argument("--threads", type=int, default=1, help="BLAS and OpenMP threads")
    parser.add_argument("--activation", choices=sorted(ACTIVATIONS), required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--lr", type=float, default=0.001, help="Adam's learning rate")
    args = parser.parse_args(argv)

    data = Path(args.data)
    features, labels = load_arrays(data, "train")

    classifier = MLPClassifier(
        hidden_layer_sizes=(args.hidden,), activation=ACTIVATIONS[args.activation], solver="adam", alpha=0.0,
        batch_size=args.batch_size, learning_rate_init=args.lr, epsilon=1e-8, max_iter=args.epochs, tol=0.0,
        n_iter_no_change=args.epochs + 1, shuffle=True, random_state=args.seed)
    with threadpool_limits(limits=args.threads), warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # stopping at max_iter is the point here
        blas_threads = sorted({pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"})
        started = time.time()
        began = time.perf_counter()
        classifier.fit(features, labels)
        fit_seconds = time.perf_counter() - began
        test_features, test_labels = load_arrays(data, "test")
        accuracy = float((classifier.predict(test_features) == test_labels).mean())

    result = {"system": "sklearn", "workers": 1, "threads": args.threads, "blas_threads": blas_threads,
              "epochs_run": classifier.n_iter_, "fit_seconds": fit_seconds,
              "seconds_per_epoch": fit_seconds / classifier.n_iter_, "train_loss": classifier.loss_curve_,
              "training_started": started, "accuracy": accuracy,
              "dtype": str(classifier.coefs_[0].dtype)}
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

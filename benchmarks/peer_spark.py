"""Spark MLlib's MultilayerPerceptronClassifier in local mode: the stand-in for the MapReduce approach.

cNeural compared itself against neural network training on Hadoop MapReduce; Spark MLlib is what
that approach became. benchmarks/peers.py runs this in pyspark's local[N] (N task threads, one
JVM) on the same arrays as shoal, turned into a DataFrame of pyspark.ml.linalg vectors through
Arrow and cached before the clock starts: only the fit is timed. MLlib's perceptron has sigmoid
hidden layers and no dropout. Its default solver, l-bfgs, computes the gradient over every row
each iteration (a full-batch epoch; the line search may add passes), so seconds per epoch here =
fit seconds / iterations actually run.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pyarrow
from py4j.protocol import Py4JError
from pyspark.ml.classification import MultilayerPerceptronClassifier
from pyspark.ml.evaluation import MulticlassClassificationEvaluator
from pyspark.ml.functions import array_to_vector
from pyspark.sql import DataFrame, SparkSession

from benchmarks.peer_arguments import load_arrays, peer_parser


def data_frame(spark: SparkSession, features: np.ndarray, labels: np.ndarray, partitions: int) -> DataFrame:
    """A cached DataFrame of (label, vector) rows with one partition per task thread."""
    table = pyarrow.table({
        "label": labels.astype(np.float64),
        "features": pyarrow.FixedSizeListArray.from_arrays(pyarrow.array(features.reshape(-1)), features.shape[1]),
    })
    frame = spark.createDataFrame(table)
    if frame.rdd.getNumPartitions() != partitions:
        frame = frame.repartition(partitions)
    frame = frame.select("label", array_to_vector("features").alias("features")).cache()
    frame.count()  # materialize the cache now, so that the fit does not pay for the conversion
    return frame


def blas_implementation(spark: SparkSession) -> str:
    """The BLAS MLlib calls: native through JNI when the machine has one, else a Java implementation."""
    try:
        return spark.sparkContext._jvm.dev.ludovic.netlib.blas.BLAS.getInstance().getClass().getSimpleName()
    except Py4JError as error:
        return f"unknown ({error.__class__.__name__})"


def main(argv: list[str] | None = None) -> None:
    parser = peer_parser(__doc__, epochs_help="maxIter: l-bfgs iterations")
    parser.add_argument("--workers", type=int, default=2, help="local[N]: task threads")
    parser.add_argument("--solver", choices=["l-bfgs", "gd"], default="l-bfgs")
    parser.add_argument("--block-size", type=int, default=128, help="rows stacked into one matrix (MLlib's default)")
    parser.add_argument("--driver-memory", default="8g")
    args = parser.parse_args(argv)

    data = Path(args.data)
    meta = json.loads((data / "meta.json").read_text())
    began = time.perf_counter()
    spark = (SparkSession.builder.master(f"local[{args.workers}]").appName("shoal-peers")
             .config("spark.driver.memory", args.driver_memory)
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", str(args.workers))
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    session_seconds = time.perf_counter() - began
    blas = blas_implementation(spark)

    began = time.perf_counter()
    train = data_frame(spark, *load_arrays(data, "train"), args.workers)
    test = data_frame(spark, *load_arrays(data, "test"), args.workers)
    conversion_seconds = time.perf_counter() - began

    layers = [meta["features"], args.hidden, meta["classes"]]
    classifier = MultilayerPerceptronClassifier(layers=layers, maxIter=args.epochs, tol=0.0, seed=args.seed,
                                                solver=args.solver, blockSize=args.block_size)
    started = time.time()
    began = time.perf_counter()
    model = classifier.fit(train)
    fit_seconds = time.perf_counter() - began
    summary = model.summary() if callable(model.summary) else model.summary
    iterations, history = summary.totalIterations, list(summary.objectiveHistory)
    evaluator = MulticlassClassificationEvaluator(metricName="accuracy")
    accuracy = evaluator.evaluate(model.transform(test))
    spark.stop()

    result = {"system": "spark", "workers": args.workers, "threads": 1, "solver": args.solver, "layers": layers,
              "block_size": args.block_size, "blas": blas, "epochs_run": iterations, "fit_seconds": fit_seconds,
              "seconds_per_epoch": fit_seconds / max(iterations, 1), "objective_history": history,
              "training_started": started,
              "setup_split": {"session": session_seconds, "data": conversion_seconds}, "accuracy": accuracy}
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

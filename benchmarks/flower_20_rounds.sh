#!/bin/bash
# A 20-round FBO-FedGP run (ckks, 5 clients, the default settings) on loopback Flower and
# in process; prints where the two JSON files are (compare exchanges_per_round and the
# results). Run it from a clone of the repository (it spawns Flower's processes, which
# import the package from it): `bash benchmarks/flower_20_rounds.sh`; BIN names the
# virtual environment's bin folder (default .venv/bin), OUT a folder for the files.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD
B=${BIN:-.venv/bin}
OUT=${OUT:-$(mktemp -d)}
S=$OUT/federation
T0=$(date +%s)
$B/botorch-fed flower up --clients 5 --allow-crypto-seed --share-results --state-dir "$S" --timeout 120
T1=$(date +%s)
status=0
$B/botorch-fed flower run fbo-fedgp --problem branin --clients 5 --num-rounds 20 \
    --aggregator ckks --seed 0 --crypto-seed 1 --state-dir "$S" --out "$OUT/flower.json" || status=$?
T2=$(date +%s)
$B/botorch-fed flower down --state-dir "$S" || true
$B/botorch-fed run fbo-fedgp --problem branin --clients 5 --num-rounds 20 \
    --aggregator ckks --seed 0 --crypto-seed 1 --out "$OUT/in_process.json"
echo "up $((T1 - T0)) s, flower run $((T2 - T1)) s; $OUT/flower.json, $OUT/in_process.json"
exit $status

#!/bin/bash
# 20-round FBO-FedGP (ckks, 5 clients, default schedule) on loopback Flower vs in process.
set -e
cd /tmp/clonef20
export PYTHONPATH=/tmp/clonef20 PYTHONDONTWRITEBYTECODE=1
B=/work/main/.venv/bin
S=/tmp/f20state
rm -rf $S
T0=$(date +%s)
$B/botorch-fed flower up --clients 5 --allow-crypto-seed --share-results --state-dir $S --timeout 120
T1=$(date +%s)
$B/botorch-fed flower run fbo-fedgp --problem branin --clients 5 --num-rounds 20 --aggregator ckks --seed 0 --crypto-seed 1 --state-dir $S --out /tmp/f20_flower.json || true
T2=$(date +%s)
$B/botorch-fed flower down --state-dir $S || true
$B/botorch-fed run fbo-fedgp --problem branin --clients 5 --num-rounds 20 --aggregator ckks --seed 0 --crypto-seed 1 --out /tmp/f20_inproc.json
echo "up $((T1-T0)) s, flower run $((T2-T1)) s"

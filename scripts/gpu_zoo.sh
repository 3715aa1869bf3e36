#!/usr/bin/env bash
# On the GPU machine: the zoo report (scripts/zoo_report.py) over zoo models carried without
# their weights (scripts/carry_weights.py strip, here), given seeded weights there. Setup as
# scripts/gpu_check.sh (staged packages in /tmp/site, the library built here in .carry/); carry
# .carry and the stripped zoo. Flags after the models go to zoo_report.py.
#   there: CORPUS=build/zooc bash scripts/gpu_zoo.sh resnet50,yolo --dtypes float32 --modes graphs --epilogues
set -uo pipefail
source scripts/gpu_env.sh
log="$OUT/gpu_zoo.log"
gpu_setup "$log"
corpus=${CORPUS:-build/zooc}
models=$1
shift
names=$(python3 -c "import json, sys
want = set(sys.argv[1].split(','))
print(' '.join(m['path'] for m in json.load(open('$corpus/manifest.json'))['models'] if m['name'] in want))" "$models")
for path in $names; do
  [ -f "/tmp/zoo/$path" ] || python3 scripts/carry_weights.py fill "$corpus/$path" /tmp/zoo 2>&1 | tail -1 | tee -a "$log"
done
python3 scripts/zoo_report.py --zoo /tmp/zoo --models "$models" --out "$OUT/zoo" "$@" 2>&1 | tee -a "$log" | tail -40
status=${PIPESTATUS[0]}
tar czf "$OUT/zoo-results.tgz" -C "$OUT" zoo 2>/dev/null
exit "$status"

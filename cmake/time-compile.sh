#!/usr/bin/env bash
# A compiler launcher that records each translation unit's CPU time (user + sys, children included):
#   cmake -DCMAKE_CUDA_COMPILER_LAUNCHER=cmake/time-compile.sh -DCMAKE_CXX_COMPILER_LAUNCHER=... 
# appends "<cpu-seconds> <wall-seconds> <source>" to $TOWERPIPE_COMPILE_TIMES (default /tmp/towerpipe-compile-times.txt).
# Sort it with: sort -rn "$TOWERPIPE_COMPILE_TIMES" | head
log=${TOWERPIPE_COMPILE_TIMES:-/tmp/towerpipe-compile-times.txt}
source=unknown
prev=""
for arg in "$@"; do
  if [ "$prev" = "-c" ] || [[ "$arg" == *.cu || "$arg" == *.cpp ]]; then [ -f "$arg" ] && source=$arg; fi
  prev=$arg
done
tmp=$(mktemp)
/usr/bin/time -f "%U %S %e" -o "$tmp" "$@"
rc=$?
read -r user sys wall <"$tmp"
rm -f "$tmp"
printf '%.1f %.1f %s\n' "$(echo "$user + $sys" | bc)" "$wall" "$source" >>"$log"
exit $rc

#!/usr/bin/env bash
# Fuzzes rota: builds every target in fuzz/ once, then runs each for a while, starting from
# its committed seed corpus (fuzz/corpus/TARGET). Exits non-zero if the build fails or any
# target finds a crash; the crashing input is left in fuzz/artifacts/TARGET/.
#
#   ./scripts/fuzz.sh                 20 seconds per target
#   ./scripts/fuzz.sh 300             5 minutes per target
#   FUZZ_TARGETS="rule_parse" ./scripts/fuzz.sh 60
#
# Needs nightly Rust (`cargo +nightly`); installs cargo-fuzz when it is missing. Targets are
# built unoptimised and without a sanitizer (`--dev -s none`): the code under test is safe
# Rust, and an optimised build takes several times as long to compile as a short run lasts.
# For long runs, build optimised once yourself: `cargo +nightly fuzz run -s none TARGET`.
# Inputs the fuzzer discovers go to a scratch folder and are thrown away; the seed corpus is
# only read.
set -uo pipefail

seconds="${1:-20}"
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -lt 1 ]; then
  echo "usage: $0 [SECONDS_PER_TARGET]" >&2
  exit 2
fi

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "fuzz: nightly Rust is needed (cargo +nightly); install it with rustup" >&2
  exit 1
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "==> installing cargo-fuzz"
  cargo install cargo-fuzz --locked || exit 1
fi

# Build and run flags must match, or `cargo fuzz run` builds again.
flags=(--dev -s none)
start=$SECONDS
echo "==> building fuzz targets"
if ! cargo +nightly fuzz build "${flags[@]}"; then
  echo "fuzz: build failed" >&2
  exit 1
fi
build_secs=$((SECONDS - start))

if [ -n "${FUZZ_TARGETS:-}" ]; then
  read -r -a targets <<<"$FUZZ_TARGETS"
else
  mapfile -t targets < <(cargo +nightly fuzz list)
fi
# A run that fuzzes nothing proves nothing: an empty list (a broken fuzz/ or `cargo fuzz list`)
# fails, as does a target without a seed corpus.
if [ "${#targets[@]}" -eq 0 ]; then
  echo "fuzz: no fuzz targets to run (cargo fuzz list printed none)" >&2
  exit 1
fi
for target in "${targets[@]}"; do
  if [ -z "$target" ] || ! [ -d "fuzz/corpus/$target" ]; then
    echo "fuzz: target ${target:-\"\"} has no seed corpus in fuzz/corpus/" >&2
    exit 1
  fi
done

scratch="$(mktemp -d "${TMPDIR:-/tmp}/rota-fuzz.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT

summary=()
failed=0
for target in "${targets[@]}"; do
  echo "==> fuzzing $target for ${seconds}s"
  mkdir -p "$scratch/$target" "fuzz/artifacts/$target"
  log="$scratch/$target.log"
  t0=$SECONDS
  # New inputs go to the scratch folder (the first corpus folder); the seeds are only read.
  cargo +nightly fuzz run "${flags[@]}" "$target" "$scratch/$target" "fuzz/corpus/$target" -- \
    -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 >"$log" 2>&1
  rc=$?
  took=$((SECONDS - t0))
  runs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)"
  seeds="$(find "fuzz/corpus/$target" -type f | wc -l)"
  if [ "$rc" -eq 0 ]; then
    summary+=("$(printf 'fuzz: %-16s ok     %9s runs in %3ss (%s seeds)' "$target" "${runs:-?}" "$took" "$seeds")")
  else
    failed=1
    tail -n 60 "$log"
    artifact="$(grep -o 'Test unit written to [^ ]*' "$log" | tail -1 | sed 's/Test unit written to //')"
    panic="$(grep -m1 -A1 'panicked at' "$log" | tr '\n' ' ')"
    summary+=("$(printf 'fuzz: %-16s FAILED after %ss: %s' "$target" "$took" "${panic:-exit $rc}")")
    if [ -n "$artifact" ]; then
      summary+=("      input: $artifact")
      summary+=("      again: cargo +nightly fuzz run ${flags[*]} $target $artifact")
    fi
  fi
done

echo
echo "fuzz: built in ${build_secs}s, ${seconds}s per target, $((SECONDS - start))s in all"
printf '%s\n' "${summary[@]}"
exit "$failed"

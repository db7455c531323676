#!/usr/bin/env bash
# Builds the Eureka test fixture (tests/sources/eureka: a standalone Eureka server and a client
# app) and places its two executable jars at stable paths, printed one a line:
#
#   target/eureka/eureka-server.jar
#   target/eureka/eureka-app.jar
#
# Nothing is built when both jars are newer than every file of the fixture's Maven project
# (poms, sources, resources, .mvn). Maven uses the default local repository (~/.m2), as
# clients/java/test.sh does.
#
#   scripts/build-eureka.sh          build if needed, print the two paths
#   scripts/build-eureka.sh --force  build even if the jars are up to date
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
project="$root/tests/sources/eureka"
out="$root/target/eureka"
jars=("$out/eureka-server.jar" "$out/eureka-app.jar")

force=0
case "${1:-}" in
  --force) force=1 ;;
  "") ;;
  *) echo "usage: scripts/build-eureka.sh [--force]" >&2; exit 2 ;;
esac

# Up to date when both jars exist and no file of the project is newer than the older of them.
up_to_date() {
  local jar oldest=""
  for jar in "${jars[@]}"; do
    [[ -f "$jar" ]] || return 1
    if [[ -z "$oldest" || "$jar" -ot "$oldest" ]]; then oldest="$jar"; fi
  done
  [[ -z "$(find "$project" \( -name target -o -name samples \) -prune -o -type f \
    ! -name README.md -newer "$oldest" -print -quit)" ]]
}

if [[ $force -eq 1 ]] || ! up_to_date; then
  command -v mvn >/dev/null || { echo "build-eureka.sh: mvn (Maven 3.8+) is required" >&2; exit 1; }
  command -v java >/dev/null || { echo "build-eureka.sh: java (17+) is required" >&2; exit 1; }
  # Maven's output goes to stderr: stdout carries only the two paths.
  (cd "$project" && mvn -B -q -ntp -Dstyle.color=never package -DskipTests) >&2
  mkdir -p "$out"
  # Copied to a temporary name first, so a reader never sees half a jar.
  cp "$project/server/target/eureka-server.jar" "$out/.eureka-server.jar.tmp"
  cp "$project/app/target/eureka-app.jar" "$out/.eureka-app.jar.tmp"
  mv -f "$out/.eureka-server.jar.tmp" "$out/eureka-server.jar"
  mv -f "$out/.eureka-app.jar.tmp" "$out/eureka-app.jar"
fi

printf '%s\n' "${jars[@]}"

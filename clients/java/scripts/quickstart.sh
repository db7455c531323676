#!/usr/bin/env bash
# Runs README.md's quick start the way a user would, once `mvn install` has put the artifacts in
# the local Maven repository (test.sh runs it first): a new Maven project under the system temp
# folder (removed at the end) with README.md's pom.xml as it is written and README.md's quick start,
# built with `mvn package` and run against a `rota serve` started here on a free loopback port.
#
#   ROTA_BIN=/abs/path/to/rota scripts/quickstart.sh
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
readme="$here/README.md"
rota_bin="${ROTA_BIN:?ROTA_BIN must name the rota binary}"
readme_target="127.0.0.1:50051"
expected="calling 127.0.0.1:8081 (ticket 0)"

work="$(mktemp -d "${TMPDIR:-/tmp}/rota-java-quickstart.XXXXXX")"
server_pid=""
cleanup() {
  if [[ -n "$server_pid" ]]; then
    kill -KILL "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# The body of the first ```LANG block after the line HEADING of README.md.
readme_block() {
  awk -v heading="$1" -v fence="\`\`\`$2" '
    $0 == heading { in_section = 1; next }
    in_section && !in_block && $0 == fence { in_block = 1; next }
    in_block && $0 == "```" { found = 1; exit }
    in_block { print }
    END { if (!found) exit 1 }
  ' "$readme" || { echo "quickstart.sh: README.md has no \`\`\`$2 block under \"$1\"" >&2; exit 1; }
}

pom="$(readme_block "## Install" xml)"
grep -q '<artifactId>rota-client</artifactId>' <<<"$pom" && grep -q '</project>' <<<"$pom" \
  || { echo "quickstart.sh: the xml block under \"## Install\" is not a whole pom.xml depending on rota-client" >&2; exit 1; }
quick_start="$(readme_block "## Quick start" java)"
class="$(sed -nE 's/^public class ([A-Za-z0-9_]+).*/\1/p' <<<"$quick_start")"
[[ -n "$class" ]] || { echo "quickstart.sh: the quick start declares no public class" >&2; exit 1; }
grep -qF "\"$readme_target\"" <<<"$quick_start" \
  || { echo "quickstart.sh: the quick start does not connect to $readme_target" >&2; exit 1; }

# A rota of its own, so that the quick start's pick is the first of a fresh rotation. Its first
# line of output is "listening on 127.0.0.1:PORT".
mkfifo "$work/rota.out"
ROTA_ADMIN_LISTEN=off "$rota_bin" serve --listen 127.0.0.1:0 >"$work/rota.out" 2>"$work/rota.log" &
server_pid=$!
exec 3<"$work/rota.out"
if ! read -r -t 30 -u 3 first; then
  echo "quickstart.sh: rota printed no address within 30 s:" >&2
  cat "$work/rota.log" >&2
  exit 1
fi
cat <&3 >/dev/null &  # keeps the server's stdout drained
address="${first#listening on }"
[[ "$address" =~ ^127\.0\.0\.1:[0-9]+$ ]] || { echo "quickstart.sh: unexpected first line from rota: $first" >&2; exit 1; }

app="$work/app"
mkdir -p "$app/src/main/java"
# README.md's pom.xml, word for word: what a user copies must build as it is.
printf '%s\n' "$pom" >"$app/pom.xml"
printf '%s\n' "${quick_start/"$readme_target"/$address}" >"$app/src/main/java/$class.java"
# The gRPC channel of the installed artifact: rota:///channel-check, whose one instance is the rota
# server itself, so one RPC through the channel (ListServices, from the stubs inside the jar)
# proves the resolver and the policy were found through META-INF/services and route.
cat >"$app/src/main/java/ChannelCheck.java" <<'JAVA'
import java.util.concurrent.TimeUnit;

import io.grpc.Grpc;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.rota.client.Instance;
import io.rota.client.Registration;
import io.rota.client.RotaClient;
import io.rota.client.channel.RotaChannels;

public class ChannelCheck {
    public static void main(String[] args) throws Exception {
        String server = args[0];
        String[] hostPort = server.split(":");
        try (RotaClient rota = RotaClient.builder().target(server).build();
                Registration provider = rota.register(Instance.of("channel-check", hostPort[0], Integer.parseInt(hostPort[1])))) {
            ManagedChannel channel = Grpc.newChannelBuilder("rota:///channel-check", InsecureChannelCredentials.create())
                    .setNameResolverArg(RotaChannels.SERVER, server)
                    .build();
            try {
                boolean listed = io.rota.v1.RegistryGrpc.newBlockingStub(channel).withDeadlineAfter(30, TimeUnit.SECONDS)
                        .listServices(io.rota.v1.ListServicesRequest.getDefaultInstance()).getServicesList().stream()
                        .anyMatch(s -> s.getName().equals("channel-check"));
                System.out.println("rota:///channel-check answered" + (listed ? "" : " without listing itself"));
            } finally {
                channel.shutdownNow();
            }
        }
    }
}
JAVA

# `mvn package` with README.md's pom, against io.rota:rota-client from the local repository (where
# test.sh's `mvn install` put it; nothing of this checkout is on the path), and, in the same build,
# the runtime classpath written out for the runs below. Both JVMs are short-lived: the C1 compiler
# alone (as .mvn/jvm.config has it for this build) halves their time.
quick_jvm="-XX:+TieredCompilation -XX:TieredStopAtLevel=1"
(cd "$app" && MAVEN_OPTS="${MAVEN_OPTS:-} $quick_jvm" mvn -B -q -ntp -Dstyle.color=never package \
  org.apache.maven.plugins:maven-dependency-plugin:3.8.1:build-classpath \
  -Dmdep.outputFile=classpath.txt -Dmdep.includeScope=runtime)
compgen -G "$app/target/*.jar" >/dev/null || { echo "quickstart.sh: mvn package made no jar" >&2; exit 1; }
# shellcheck disable=SC2086 # quick_jvm is two options
output="$(cd "$app" && timeout 60 java $quick_jvm -cp "target/classes:$(cat classpath.txt)" "$class")"
if [[ "$output" != "$expected" ]]; then
  echo "quickstart.sh: the quick start printed:" >&2
  echo "$output" >&2
  echo "expected: $expected" >&2
  exit 1
fi
echo "quickstart: $output (README.md's quick start in a fresh Maven project)"
# shellcheck disable=SC2086 # quick_jvm is two options
channel_output="$(cd "$app" && timeout 60 java $quick_jvm -cp "target/classes:$(cat classpath.txt)" ChannelCheck "$address")"
if [[ "$channel_output" != "rota:///channel-check answered" ]]; then
  echo "quickstart.sh: the channel check printed: $channel_output" >&2
  exit 1
fi
echo "quickstart: $channel_output (a rota:/// channel from the installed artifact)"

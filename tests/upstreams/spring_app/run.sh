#!/usr/bin/env bash
# Builds (when needed) and runs the Spring MVC upstream on 127.0.0.1:PORT:
#   tests/upstreams/spring_app/run.sh PORT BUILD_DIR
# Compiles the sources beside this script into BUILD_DIR/classes with plain javac against
# Debian's jars in /usr/share/java (tests/upstreams/install-spring.sh installs them), only when
# BUILD_DIR/classes is missing or older than a source; then execs java, which serves until killed.
# Several runs may share BUILD_DIR: the build is done under a lock on BUILD_DIR/.lock.
# Writes nothing outside BUILD_DIR.
set -euo pipefail

if [ "$#" -ne 2 ]; then
  echo "usage: $0 PORT BUILD_DIR" >&2
  exit 2
fi
port="$1"
build="$2"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
jars=/usr/share/java

classpath=""
for jar in \
    spring3-web.servlet spring3-web spring3-context spring3-aop spring3-beans spring3-core \
    spring3-expression commons-logging servlet-api \
    jetty9-server jetty9-servlet jetty9-security jetty9-http jetty9-io jetty9-util; do
  if [ ! -f "$jars/$jar.jar" ]; then
    echo "$0: $jars/$jar.jar is missing; run tests/upstreams/install-spring.sh" >&2
    exit 1
  fi
  classpath="$classpath${classpath:+:}$jars/$jar.jar"
done

mkdir -p "$build"
build="$(cd "$build" && pwd)"
classes="$build/classes"

stale() {
  [ -f "$classes/.built" ] || return 0
  [ -n "$(find "$here" -maxdepth 1 -name '*.java' -newer "$classes/.built" -print -quit)" ]
}

if stale; then
  exec 9>"$build/.lock"
  flock 9
  if stale; then
    rm -rf "$build/classes.new"
    mkdir -p "$build/classes.new"
    # --release 8: Spring 4.3's repackaged ASM/CGLIB read the app's class files.
    # javac's output (notes about deprecated Jetty API) is shown only when it fails.
    if ! log="$(javac -J-XX:-UsePerfData -nowarn -Xlint:-options --release 8 -encoding UTF-8 -cp "$classpath" \
        -d "$build/classes.new" "$here"/*.java 2>&1)"; then
      printf '%s\n' "$log" >&2
      echo "$0: javac failed" >&2
      exit 1
    fi
    touch "$build/classes.new/.built"
    rm -rf "$classes"
    mv "$build/classes.new" "$classes"
  fi
  flock -u 9
  exec 9>&-
fi

# --add-opens: Spring 4.3's CGLIB defines the @Configuration proxies through
# ClassLoader.defineClass by reflection. -XX:TieredStopAtLevel=1, the serial GC and -Xshare:auto for a quick
# start; -XX:-UsePerfData so the JVM writes no hsperfdata file under /tmp.
exec java \
  -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xmx256m -XX:-UsePerfData -Xshare:auto \
  --add-opens java.base/java.lang=ALL-UNNAMED \
  -Djava.io.tmpdir="$build" \
  -cp "$classes:$classpath" \
  SpringApp "$port"

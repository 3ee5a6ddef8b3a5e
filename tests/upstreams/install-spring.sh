#!/usr/bin/env bash
# Installs, only where missing, what the Spring MVC upstream (tests/upstreams/spring_app/) needs:
# Debian's Spring Framework 4.3 (libspring-web-servlet-java, which brings spring-web, -context,
# -beans, -core, -aop, -expression and commons-logging), Jetty 9.4's library jars
# (libjetty9-java, with the servlet API; not the jetty9 daemon package) and, if javac is
# missing, a JDK (openjdk-17-jdk-headless). Recommended packages are not installed.
# Idempotent; runnable from any directory. Prints one line,
#   spring: present (VERSION) | spring: installed (VERSION) | spring: FAILED ...
# and exits non-zero on failure.
set -u

PACKAGES=(libspring-web-servlet-java libjetty9-java)
# The jars tests/upstreams/spring_app/run.sh puts on the class path.
JARS=(spring3-web.servlet spring3-web spring3-context spring3-aop spring3-beans spring3-core
  spring3-expression commons-logging servlet-api jetty9-server jetty9-servlet jetty9-security
  jetty9-http jetty9-io jetty9-util)

have_all() {
  command -v java >/dev/null 2>&1 && command -v javac >/dev/null 2>&1 || return 1
  local jar
  for jar in "${JARS[@]}"; do
    [ -f "/usr/share/java/$jar.jar" ] || return 1
  done
}

version() {
  local spring jetty
  spring="$(dpkg-query -W -f='${Version}' libspring-web-servlet-java 2>/dev/null)"
  jetty="$(dpkg-query -W -f='${Version}' libjetty9-java 2>/dev/null)"
  echo "Spring MVC ${spring:-?}, Jetty ${jetty:-?}, $(javac -version 2>&1 | head -n 1)"
}

if have_all; then
  echo "spring: present ($(version))"
  exit 0
fi

wanted=("${PACKAGES[@]}")
if ! command -v javac >/dev/null 2>&1; then
  wanted+=(openjdk-17-jdk-headless)
fi

if apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null \
    && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
      --no-install-recommends "${wanted[@]}" >/dev/null \
    && have_all; then
  echo "spring: installed ($(version))"
  exit 0
fi

echo "spring: FAILED to install (apt-get install ${wanted[*]}), or a jar run.sh needs is missing from /usr/share/java"
exit 1

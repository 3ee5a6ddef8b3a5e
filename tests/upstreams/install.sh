#!/usr/bin/env bash
# Installs, only where missing, what the differential test's upstreams need:
#   nginx (Debian, with the DAV module), golang-go and golang-github-google-uuid-dev (Debian),
#   Flask 3 and Django (pip), Express 5 with uuid (npm), Rails 6.1 (Debian ruby-rails, with
#   SQLite and PostgreSQL drivers), Spring MVC 4.3 on Jetty 9 (Debian),
#   HAProxy (Debian) for the rolling-restart test,
# the Stripe end-to-end test's client library: stripe 16.1.0 (pip), the Adyen, PayPal and Square
# libraries (pip, pinned in install-payments.sh), and for the token snippets test psycopg 3.3.9,
# kazoo 2.11.0, redis 8.1.0, boto3 1.43.11 and moto 5.2.1 (pip) and Apache Curator (Debian
# libcurator-recipes-java, and a JDK if javac is missing).
# Idempotent; runnable from any directory. Prints one line per tool and exits non-zero, naming
# what failed, if any install fails.
set -u

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/../.." || { echo "install.sh: cannot cd to the repository root" >&2; exit 1; }

failed=()
apt_updated=0

apt_install() {
  if [ "$apt_updated" = 0 ]; then
    apt-get -o DPkg::Lock::Timeout=600 update -qq || return 1
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "$@" \
    >/dev/null || return 1
}

# nginx, with the WebDAV module built in.
if command -v nginx >/dev/null 2>&1; then
  state=present
elif apt_install nginx && command -v nginx >/dev/null 2>&1; then
  state=installed
else
  state=failed
fi
if [ "$state" = failed ]; then
  echo "nginx: FAILED to install (apt-get install nginx)"
  failed+=(nginx)
elif ! nginx -V 2>&1 | grep -q -- '--with-http_dav_module'; then
  echo "nginx: $state but built without --with-http_dav_module (nginx -V); the DAV upstream cannot run"
  failed+=(nginx-dav)
else
  echo "nginx: $state ($(nginx -v 2>&1 | sed 's/^nginx version: //'), dav module built in)"
fi

# HAProxy, the load balancer of the rolling-restart test (tests/process/rolling_restart.rs).
if command -v haproxy >/dev/null 2>&1; then
  echo "haproxy: present ($(haproxy -v 2>&1 | head -1 | awk '{print $3}'))"
elif apt_install haproxy && command -v haproxy >/dev/null 2>&1; then
  echo "haproxy: installed ($(haproxy -v 2>&1 | head -1 | awk '{print $3}'))"
else
  echo "haproxy: FAILED to install (apt-get install haproxy)"
  failed+=(haproxy)
fi

# Go toolchain (standard library only; Debian's golang-go).
if command -v go >/dev/null 2>&1; then
  echo "go: present ($(go version | awk '{print $3}'))"
elif apt_install golang-go && command -v go >/dev/null 2>&1; then
  echo "go: installed ($(go version | awk '{print $3}'))"
else
  echo "go: FAILED to install (apt-get install golang-go)"
  failed+=(go)
fi

# Flask 3 for the python3 on PATH.
flask_version() { python3 -c 'import importlib.metadata as m; print(m.version("flask"))' 2>/dev/null; }
if ! command -v python3 >/dev/null 2>&1; then
  echo "flask: FAILED: no python3 on PATH"
  failed+=(flask)
elif python3 -c 'import flask' >/dev/null 2>&1; then
  echo "flask: present ($(flask_version))"
else
  if ! python3 -m pip --version >/dev/null 2>&1; then
    apt_install python3-pip >/dev/null 2>&1 || true
  fi
  # A Debian system python refuses plain pip installs (PEP 668); retry with the override there.
  if { python3 -m pip install -q 'flask>=3' || python3 -m pip install -q --break-system-packages 'flask>=3'; } \
      && python3 -c 'import flask' >/dev/null 2>&1; then
    echo "flask: installed ($(flask_version))"
  else
    echo "flask: FAILED to install (python3 -m pip install flask)"
    failed+=(flask)
  fi
fi

# The official Stripe Python library, pinned, for tests/process/stripe.rs (with requests, its
# HTTP client, which pip brings along).
STRIPE_VERSION=16.1.0
stripe_version() { python3 -c 'import importlib.metadata as m; print(m.version("stripe"))' 2>/dev/null; }
if ! command -v python3 >/dev/null 2>&1; then
  echo "stripe: FAILED: no python3 on PATH"
  failed+=(stripe)
elif [ "$(stripe_version)" = "$STRIPE_VERSION" ] && python3 -c 'import stripe, requests' >/dev/null 2>&1; then
  echo "stripe: present ($STRIPE_VERSION)"
else
  if ! python3 -m pip --version >/dev/null 2>&1; then
    apt_install python3-pip >/dev/null 2>&1 || true
  fi
  # A Debian system python refuses plain pip installs (PEP 668); retry with the override there.
  if { python3 -m pip install -q "stripe==$STRIPE_VERSION" \
       || python3 -m pip install -q --break-system-packages "stripe==$STRIPE_VERSION"; } \
      && python3 -c 'import stripe, requests' >/dev/null 2>&1; then
    echo "stripe: installed ($(stripe_version))"
  else
    echo "stripe: FAILED to install (python3 -m pip install stripe==$STRIPE_VERSION)"
    failed+=(stripe)
  fi
fi

# psycopg 3 (with its bundled libpq), pinned, for the PostgreSQL lease snippet that
# tests/process/token_snippets/ runs (examples/tokens/pg_lease.py).
PSYCOPG_VERSION=3.3.9
psycopg_version() { python3 -c 'import importlib.metadata as m; print(m.version("psycopg"))' 2>/dev/null; }
if ! command -v python3 >/dev/null 2>&1; then
  echo "psycopg: FAILED: no python3 on PATH"
  failed+=(psycopg)
elif [ "$(psycopg_version)" = "$PSYCOPG_VERSION" ] && python3 -c 'import psycopg' >/dev/null 2>&1; then
  echo "psycopg: present ($PSYCOPG_VERSION)"
else
  if ! python3 -m pip --version >/dev/null 2>&1; then
    apt_install python3-pip >/dev/null 2>&1 || true
  fi
  # A Debian system python refuses plain pip installs (PEP 668); retry with the override there.
  if { python3 -m pip install -q "psycopg[binary]==$PSYCOPG_VERSION" \
       || python3 -m pip install -q --break-system-packages "psycopg[binary]==$PSYCOPG_VERSION"; } \
      && python3 -c 'import psycopg' >/dev/null 2>&1; then
    echo "psycopg: installed ($(psycopg_version))"
  else
    echo "psycopg: FAILED to install (python3 -m pip install psycopg[binary]==$PSYCOPG_VERSION)"
    failed+=(psycopg)
  fi
fi

# kazoo, pinned, for the ZooKeeper snippet (examples/tokens/zk_lock.py) that
# tests/process/token_snippets/ runs against the ZooKeeper scripts/zookeeper-setup.sh starts.
KAZOO_VERSION=2.11.0
kazoo_version() { python3 -c 'import importlib.metadata as m; print(m.version("kazoo"))' 2>/dev/null; }
if ! command -v python3 >/dev/null 2>&1; then
  echo "kazoo: FAILED: no python3 on PATH"
  failed+=(kazoo)
elif [ "$(kazoo_version)" = "$KAZOO_VERSION" ] && python3 -c 'import kazoo' >/dev/null 2>&1; then
  echo "kazoo: present ($KAZOO_VERSION)"
else
  if { python3 -m pip install -q "kazoo==$KAZOO_VERSION" \
       || python3 -m pip install -q --break-system-packages "kazoo==$KAZOO_VERSION"; } \
      && python3 -c 'import kazoo' >/dev/null 2>&1; then
    echo "kazoo: installed ($(kazoo_version))"
  else
    echo "kazoo: FAILED to install (python3 -m pip install kazoo==$KAZOO_VERSION)"
    failed+=(kazoo)
  fi
fi

# Python packages of the Redis and DynamoDB token snippets (examples/tokens/redis_lock.py,
# dynamodb_lock.py) that tests/process/token_snippets/ runs: redis-py, boto3, and moto, whose
# server emulates DynamoDB for the second (no DynamoDB can run here). Each pinned; NAME DIST==VERSION
# MODULE: reported as NAME, installed as DIST, checked by importing MODULE.
pip_pinned() {
  local name=$1 requirement=$2 module=$3 dist version
  dist=${requirement%%==*}
  dist=${dist%%[*}
  version=${requirement##*==}
  installed() { python3 -c "import importlib.metadata as m; print(m.version('$dist'))" 2>/dev/null; }
  if ! command -v python3 >/dev/null 2>&1; then
    echo "$name: FAILED: no python3 on PATH"
    failed+=("$name")
  elif [ "$(installed)" = "$version" ] && python3 -c "import $module" >/dev/null 2>&1; then
    echo "$name: present ($version)"
  elif { python3 -m pip install -q "$requirement" \
         || python3 -m pip install -q --break-system-packages "$requirement"; } \
       && python3 -c "import $module" >/dev/null 2>&1; then
    echo "$name: installed ($(installed))"
  else
    echo "$name: FAILED to install (python3 -m pip install '$requirement')"
    failed+=("$name")
  fi
}
pip_pinned redis-py "redis==8.1.0" redis
pip_pinned boto3 "boto3==1.43.11" boto3
pip_pinned moto "moto[dynamodb,server]==5.2.1" moto.server

# Apache Curator, for the Curator snippet (examples/tokens/CuratorLock.java) that
# tests/process/token_snippets/ compiles with javac and runs: Debian's libcurator-recipes-java,
# which brings ZooKeeper's Java client, Guava and SLF4J, and, if javac is missing, a JDK.
# CURATOR_JARS are the jars of the test's class path (JAVA_JARS there), in /usr/share/java.
CURATOR_JARS=(curator-recipes curator-framework curator-client zookeeper zookeeper-jute guava
  slf4j-api slf4j-simple)
have_curator() {
  command -v java >/dev/null 2>&1 && command -v javac >/dev/null 2>&1 || return 1
  local jar
  for jar in "${CURATOR_JARS[@]}"; do
    [ -f "/usr/share/java/$jar.jar" ] || return 1
  done
}
curator_version() {
  local curator
  curator="$(dpkg-query -W -f='${Version}' libcurator-recipes-java 2>/dev/null)"
  echo "Curator ${curator:-?}, $(javac -version 2>&1 | head -n 1)"
}
if have_curator; then
  echo "curator: present ($(curator_version))"
else
  curator_packages=(libcurator-recipes-java libslf4j-java)
  if ! command -v javac >/dev/null 2>&1; then
    curator_packages+=(openjdk-17-jdk-headless)
  fi
  if apt_install --no-install-recommends "${curator_packages[@]}" && have_curator; then
    echo "curator: installed ($(curator_version))"
  else
    echo "curator: FAILED to install (apt-get install ${curator_packages[*]})," \
      "or a jar of CURATOR_JARS is missing from /usr/share/java"
    failed+=(curator)
  fi
fi

# Express 5 into tests/upstreams/node_modules.
if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
  apt_install nodejs npm >/dev/null 2>&1 || true
fi
express_version() {
  node -p 'require("./tests/upstreams/node_modules/express/package.json").version' 2>/dev/null
}
if ! command -v npm >/dev/null 2>&1; then
  echo "express: FAILED: no node/npm (apt-get install nodejs npm failed)"
  failed+=(express)
elif [ -f tests/upstreams/node_modules/express/package.json ] \
    && [ -f tests/upstreams/node_modules/uuid/package.json ]; then
  echo "express: present ($(express_version))"
else
  if [ -f tests/upstreams/package-lock.json ]; then
    npm_cmd=(npm ci --prefix tests/upstreams --no-audit --no-fund --loglevel=error)
  else
    npm_cmd=(npm install --prefix tests/upstreams --no-audit --no-fund --loglevel=error)
  fi
  if "${npm_cmd[@]}" >/dev/null && [ -f tests/upstreams/node_modules/express/package.json ]; then
    echo "express: installed ($(express_version))"
  else
    echo "express: FAILED to install (${npm_cmd[*]})"
    failed+=(express)
  fi
fi

# The frameworks whose install steps live beside their apps: Django, Go's uuid package, Rails,
# Spring MVC on Jetty; and the payment libraries payments_client.py drives (after stripe above,
# whose version and requests' they hold). Each prints its own lines.
for part in django go-uuid rails spring payments; do
  if ! bash "tests/upstreams/install-$part.sh"; then
    failed+=("$part")
  fi
done

if [ "${#failed[@]}" -gt 0 ]; then
  echo "install.sh: could not provide: ${failed[*]}" >&2
  exit 1
fi
exit 0

#!/usr/bin/env bash
# Makes sure the local PostgreSQL (127.0.0.1:5432) and Redis (127.0.0.1:6379) used by the store
# tests are running, starting them when they are installed but stopped. Prints what it finds;
# a service that is not installed is reported, and the tests that need it will fail clearly.
# Then scripts/tls-setup.sh gives them TLS for the store-TLS tests (PostgreSQL ssl on, TLS-only
# Redis on 6380 and 6381, the test certificates in /var/lib/fencegate-test-tls), and
# scripts/etcd-setup.sh starts the etcd servers for the etcd store tests (plain on 2379, TLS with
# client certificates from the test CA on 2381, authentication on 2383), installing etcd if needed,
# and scripts/zookeeper-setup.sh starts ZooKeeper on 2181 for the ZooKeeper token snippet.
set -u

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() {
  for _ in $(seq 1 50); do port_open "$1" && return 0; sleep 0.2; done
  return 1
}

if port_open 5432; then
  echo "postgres: up"
elif command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
  echo "postgres: starting"
  for version in $(ls /etc/postgresql); do
    pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
  done
  wait_port 5432 && echo "postgres: up" || echo "postgres: did not come up"
else
  echo "postgres: not installed"
fi

if port_open 6379; then
  echo "redis: up"
elif command -v redis-server >/dev/null 2>&1; then
  echo "redis: starting"
  mkdir -p /var/lib/redis /var/log/redis 2>/dev/null || true
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log || true
  wait_port 6379 && echo "redis: up" || echo "redis: did not come up"
else
  echo "redis: not installed"
fi

# Exits non-zero when a step failed; the store-TLS tests then fail naming what is missing.
"$(dirname "$0")/tls-setup.sh" || echo "tls: setup incomplete; the store TLS tests will fail"
# After tls-setup.sh: the TLS etcd uses the test CA. Exits non-zero when a server is not up.
"$(dirname "$0")/etcd-setup.sh" || echo "etcd: setup incomplete; the etcd tests will fail"
# Exits non-zero when ZooKeeper is not up; the ZooKeeper snippet's test then fails naming it.
"$(dirname "$0")/zookeeper-setup.sh" || echo "zookeeper: setup incomplete; the ZooKeeper snippet test will fail"
exit 0

#!/usr/bin/env bash
# Starts the local ZooKeeper (127.0.0.1:2181, standalone) that the ZooKeeper token snippet's test
# (tests/process/token_snippets/, examples/tokens/zk_lock.py) takes its locks in, installing
# Debian's zookeeper when it is missing. Data in /var/lib/fencegate-test-zk, log in
# /var/log/fencegate-test-zk.log; started by hand in the background (the package's service cannot
# start here) and left running. Idempotent: nothing is started when the port answers. Run by
# scripts/ensure-services.sh; prints one line and exits non-zero when ZooKeeper is not up.
set -u

DIR=${FENCEGATE_TEST_ZK_DIR:-/var/lib/fencegate-test-zk}
PORT=2181

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

if port_open "$PORT"; then
  echo "zookeeper: up"
  exit 0
fi
if [ ! -x /usr/share/zookeeper/bin/zkServer.sh ]; then
  echo "zookeeper: installing (Debian zookeeper)"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq zookeeper; } >/dev/null 2>&1 ||
    { echo "zookeeper: FAILED to install"; exit 1; }
fi
mkdir -p "$DIR/data" "$DIR/conf"
cat >"$DIR/conf/zoo.cfg" <<CFG
tickTime=2000
initLimit=10
syncLimit=5
dataDir=$DIR/data
clientPort=$PORT
clientPortAddress=127.0.0.1
admin.enableServer=false
4lw.commands.whitelist=ruok
CFG
cp -n /etc/zookeeper/conf/log4j.properties "$DIR/conf/" 2>/dev/null || true
cp -n /etc/zookeeper/conf/logback.xml "$DIR/conf/" 2>/dev/null || true
# setsid and nohup keep it running after this script and its session end.
ZOOCFGDIR="$DIR/conf" ZOO_LOG_DIR=/var/log \
  setsid nohup /usr/share/zookeeper/bin/zkServer.sh start-foreground "$DIR/conf/zoo.cfg" \
  </dev/null >>/var/log/fencegate-test-zk.log 2>&1 8>&- 9>&- &
for _ in $(seq 1 100); do
  if port_open "$PORT"; then
    echo "zookeeper: up"
    exit 0
  fi
  sleep 0.2
done
echo "zookeeper: did not come up (see /var/log/fencegate-test-zk.log)"
exit 1

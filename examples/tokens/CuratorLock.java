// Take Curator's InterProcessMutex, write once through fencegate with its fencing token, release.
//
//     J=/usr/share/java
//     CP=$J/curator-recipes.jar:$J/curator-framework.jar:$J/curator-client.jar:$J/zookeeper.jar
//     CP=$CP:$J/zookeeper-jute.jar:$J/guava.jar:$J/slf4j-api.jar
//     javac -cp "$CP" -d classes CuratorLock.java
//     java -cp "classes:$CP" CuratorLock GATEWAY_URL [--zk HOSTS] [--lock PATH]
//
// Needs Apache Curator 5 (Debian: libcurator-recipes-java, which brings ZooKeeper's client, Guava
// and SLF4J) and Java 11 or later. The lock is Curator's own InterProcessMutex: each contender
// creates an ephemeral sequential node `_c_<uuid>-lock-0000000007` under the lock node PATH, and
// the lowest sequence number holds the lock. The fencing token is our node's sequence number:
// ZooKeeper takes it from a counter of PATH, which grows by at least one with every node created
// under it. Never delete PATH, or the counter starts again at 0 and every later token is below
// the gateway's mark; nor let Curator create it (see ensurePersistent). Prints `token=N`, then
// `status=N` (the gateway's answer to the PUT); exits 0 when the write was accepted (2xx).
//
// The node lives as long as our ZooKeeper session: release deletes it, and so does ZooKeeper when
// the session expires (a process paused, or cut off, for longer than the session timeout). The
// next contender then holds the lock while this process may still believe it does: that is what
// the token is for. The gateway refuses it once a later holder has written (or, on a route that
// follows ZooKeeper itself, as soon as the node is gone). A holder that works for longer should
// also listen to the client's connection state: LOST means the lock is gone.

import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.ExponentialBackoffRetry;
import org.apache.zookeeper.KeeperException;

public class CuratorLock {
    /** Digits ZooKeeper appends to a sequential node's name. */
    private static final int SEQUENCE_DIGITS = 10;

    /** Curator's mutex, telling which node is ours. */
    static final class FencedMutex extends InterProcessMutex {
        FencedMutex(CuratorFramework client, String path) {
            super(client, path);
        }

        /** Our node (`PATH/_c_<uuid>-lock-0000000007`) while this thread holds the mutex. */
        String ourNode() {
            return getLockPath();
        }
    }

    /**
     * Creates the lock node PATH (and its parents) as a persistent node unless it exists. Left
     * to itself, InterProcessMutex creates it as a container node, which ZooKeeper deletes once
     * its last child has gone (within a minute, by default): the counter, and every token after
     * it, would start again at 0.
     */
    static void ensurePersistent(CuratorFramework client, String path) throws Exception {
        try {
            client.create().creatingParentsIfNeeded().forPath(path, new byte[0]);
        } catch (KeeperException.NodeExistsException alreadyThere) {
            // Kept from an earlier holder, with its counter: as it should be.
        }
    }

    /** The fencing token: the sequence number ZooKeeper appended to our node's name. */
    static long token(String node) {
        return Long.parseLong(node.substring(node.length() - SEQUENCE_DIGITS));
    }

    static HttpResponse<String> fencedPut(String url, long token, String body) throws Exception {
        HttpRequest request = HttpRequest.newBuilder(URI.create(url))
                .timeout(Duration.ofSeconds(10))
                .header("X-Fence", Long.toString(token))
                .PUT(HttpRequest.BodyPublishers.ofString(body))
                .build();
        // A refusal (409 stale-fence and other problem answers) is an answer, not an exception.
        return HttpClient.newHttpClient().send(request, HttpResponse.BodyHandlers.ofString());
    }

    public static void main(String[] args) throws Exception {
        String url = null;
        String hosts = "127.0.0.1:2181";
        String lockPath = "/locks/invoice/42";
        for (int i = 0; i < args.length; i++) {
            if (args[i].equals("--zk") && i + 1 < args.length) {
                hosts = args[++i];
            } else if (args[i].equals("--lock") && i + 1 < args.length) {
                lockPath = args[++i];
            } else if (url == null && !args[i].startsWith("--")) {
                url = args[i];
            } else {
                url = null;
                break;
            }
        }
        if (url == null) {
            System.err.println("usage: CuratorLock GATEWAY_URL [--zk HOSTS] [--lock PATH]");
            System.exit(2);
        }

        int status;
        // The retry policy covers a dropped connection within the session; the session is the
        // lease.
        try (CuratorFramework client = CuratorFrameworkFactory.newClient(
                hosts, new ExponentialBackoffRetry(100, 5))) {
            client.start();
            ensurePersistent(client, lockPath);
            FencedMutex mutex = new FencedMutex(client, lockPath);
            mutex.acquire(); // blocks until our node is the lowest under PATH
            try {
                long token = token(mutex.ourNode());
                System.out.println("token=" + token);
                HttpResponse<String> answer = fencedPut(url, token, "written under token " + token);
                status = answer.statusCode();
                System.out.println("status=" + status);
                if (status >= 300) {
                    System.err.println(answer.body());
                }
            } finally {
                mutex.release(); // deletes our node; a lost session deletes it too
            }
        }
        System.exit(status >= 200 && status < 300 ? 0 : 1);
    }
}

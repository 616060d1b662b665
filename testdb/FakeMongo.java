import de.bwaldvogel.mongo.MongoServer;
import de.bwaldvogel.mongo.MongoVersion;
import de.bwaldvogel.mongo.backend.memory.MemoryBackend;

import java.net.InetSocketAddress;
import java.util.List;

/**
 * Starts mongo-java-server with its oplog (so change streams work) on 127.0.0.1.
 *
 * <p>Usage: {@code java FakeMongo [port]} (port 0 or absent: a free one). Prints
 * {@code LISTENING host:port} once bound and exits when its standard input closes, so a test
 * process that dies never leaves a server behind.
 */
public final class FakeMongo {
    /**
     * MongoDB 5.0 with the wire version a 5.0 server really reports. The library's own
     * {@code ServerVersion.MONGO_5_0} reports wire 8, which drivers that need wire 9+ refuse.
     */
    private static final MongoVersion MONGO_5_0_WIRE_13 = new MongoVersion() {
        @Override
        public List<Integer> getVersionArray() {
            return List.of(5, 0, 0);
        }

        @Override
        public int getWireVersion() {
            return 13;
        }
    };

    public static void main(String[] args) throws Exception {
        int port = args.length > 0 ? Integer.parseInt(args[0]) : 0;
        MemoryBackend backend = new MemoryBackend();
        backend.version(MONGO_5_0_WIRE_13);
        MongoServer server = new MongoServer(backend);
        server.enableOplog();
        server.bind("127.0.0.1", port);
        InetSocketAddress address = server.getLocalAddress();
        System.out.println("LISTENING " + address.getHostString() + ":" + address.getPort());
        System.out.flush();
        // Block until the parent closes our stdin (or dies), then stop.
        while (System.in.read() != -1) {
            // ignore input
        }
        server.shutdownNow();
        System.exit(0);
    }
}

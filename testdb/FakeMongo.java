import de.bwaldvogel.mongo.MongoDatabase;
import de.bwaldvogel.mongo.MongoServer;
import de.bwaldvogel.mongo.MongoVersion;
import de.bwaldvogel.mongo.backend.CollectionOptions;
import de.bwaldvogel.mongo.backend.CursorRegistry;
import de.bwaldvogel.mongo.backend.Index;
import de.bwaldvogel.mongo.backend.Missing;
import de.bwaldvogel.mongo.backend.QueryResult;
import de.bwaldvogel.mongo.backend.memory.MemoryBackend;
import de.bwaldvogel.mongo.backend.memory.MemoryCollection;
import de.bwaldvogel.mongo.backend.memory.MemoryDatabase;
import de.bwaldvogel.mongo.bson.BsonRegularExpression;
import de.bwaldvogel.mongo.bson.Document;
import de.bwaldvogel.mongo.backend.Cursor;
import de.bwaldvogel.mongo.backend.aggregation.Aggregation;
import de.bwaldvogel.mongo.oplog.Oplog;

import java.net.InetSocketAddress;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * Starts mongo-java-server with its oplog (so change streams work) on 127.0.0.1.
 *
 * <p>Usage: {@code java FakeMongo [port]} (port 0 or absent: a free one). Prints
 * {@code LISTENING host:port} once bound and exits when its standard input closes, so a test
 * process that dies never leaves a server behind.
 *
 * <p>Three changes to the stock server:
 * <ul>
 *   <li>it reports MongoDB 5.0 with wire version 13 ({@link #MONGO_5_0_WIRE_13});</li>
 *   <li>an update's change event names its row in {@code documentKey._id}, as MongoDB's do,
 *       beside the update spec the stock server puts there ({@link RowNamingOplog});</li>
 *   <li>it serves every filter that pins {@code _id} by plain equality, and a top-level
 *       {@code {_id: {$in: [...]}}}, from its {@code _id} index ({@link IdIndexCollection}), as
 *       MongoDB does. Environment variable
 *       {@value #ID_INDEX_SWITCH}{@code =0} turns this off (the stock server), {@code 1} or unset
 *       leaves it on.</li>
 * </ul>
 */
public final class FakeMongo {
    /** {@code 0}: the stock query planner; {@code 1} or unset: {@link IdIndexCollection}. */
    static final String ID_INDEX_SWITCH = "COUNTERD_TESTDB_ID_INDEX";

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
        String idIndex = System.getenv().getOrDefault(ID_INDEX_SWITCH, "1");
        MemoryBackend backend;
        if (idIndex.equals("1")) {
            backend = new IdIndexBackend();
        } else if (idIndex.equals("0")) {
            System.err.println("fake server: " + ID_INDEX_SWITCH
                + "=0, stock query planner (filters beyond _id scan their collection)");
            backend = new MemoryBackend() {
                @Override
                protected Oplog createOplog() {
                    return new RowNamingOplog(super.createOplog());
                }
            };
        } else {
            System.err.println("fake server: " + ID_INDEX_SWITCH + " must be 0 or 1, not " + idIndex);
            System.exit(2);
            return;
        }
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

    /**
     * The stock oplog, except that an update's entry carries the row's {@code _id} beside its
     * update spec, so that its change event's {@code documentKey} is
     * {@code {$set: ..., $unset: ..., _id: id}}.
     *
     * <p>Why: the stock server puts the update spec into an update event's {@code documentKey}
     * and nothing else, so without {@code fullDocument: updateLookup} an update names no row at
     * all; and its lookup scans the whole collection for every update event (about 860 events
     * per second on the benchmark's outage backlog, against a whole stream read in under a
     * second without). MongoDB names the row in every event's {@code documentKey}, so counterd
     * reads the rows it cannot derive itself in one batched read instead of asking for a lookup
     * per event. The spec still rides along (counterd reads the fake's updates from it) and the
     * lookup, when asked for, still works: it reads only {@code $set} and {@code $unset}.
     */
    static final class RowNamingOplog implements Oplog {
        private final Oplog stock;

        RowNamingOplog(Oplog stock) {
            this.stock = stock;
        }

        @Override
        public void handleInsert(String namespace, List<Document> documents) {
            stock.handleInsert(namespace, documents);
        }

        @Override
        public void handleUpdate(String namespace, Document selector, Document query,
                                 List<Object> modifiedIds) {
            for (Object id : modifiedIds) {
                Document named = query.clone();
                named.put("_id", id);
                stock.handleUpdate(namespace, selector, named, List.of(id));
            }
        }

        @Override
        public void handleDelete(String namespace, Document query, List<Object> deletedIds) {
            stock.handleDelete(namespace, query, deletedIds);
        }

        @Override
        public void handleDropCollection(String namespace) {
            stock.handleDropCollection(namespace);
        }

        @Override
        public Cursor createCursor(Document changeStreamDocument, String namespace,
                                   Aggregation aggregation) {
            return stock.createCursor(changeStreamDocument, namespace, aggregation);
        }
    }

    /** A {@link MemoryBackend} whose databases create {@link IdIndexCollection}s. */
    static final class IdIndexBackend extends MemoryBackend {
        @Override
        protected Oplog createOplog() {
            return new RowNamingOplog(super.createOplog());
        }

        @Override
        public MemoryDatabase openOrCreateDatabase(String databaseName) {
            return new MemoryDatabase(databaseName, getCursorRegistry()) {
                @Override
                protected MemoryCollection openOrCreateCollection(String collectionName,
                                                                  CollectionOptions options) {
                    return new IdIndexCollection(this, collectionName, options, cursorRegistry);
                }
            };
        }
    }

    /**
     * A {@link MemoryCollection} that looks a document up in the {@code _id} index whenever the
     * filter pins {@code _id} by plain equality.
     *
     * <p>Why: the stock server uses an index only for a query whose keys are exactly the index's
     * keys ({@code AbstractUniqueIndex.canHandle}, tried by {@code AbstractMongoCollection
     * .queryDocuments}). So {@code {_id: X}} is a hash lookup but counterd's guarded statements
     * ({@code {_id: X, applied_through: {$lt: T}, epoch: {$lte: E}}}) scan the whole collection:
     * 1 000 of them on a 20 000-document ledger took ~100x as long as the same updates on
     * {@code _id} alone, so on this server the worker was quadratic in its ledger. MongoDB plans
     * such a filter as an {@code _id} lookup followed by the rest of the filter.
     *
     * <p>What: {@link #queryDocuments}, through which the server's finds, counts, updates (upserts
     * included), deletes and findAndModify all select their documents, takes the position the
     * {@code _id} index holds for {@code {_id: v}} (the lookup the stock server itself does for
     * that exact query) and hands it to the server's own {@code matchDocuments}, which applies the
     * WHOLE filter (the {@code _id} condition too) with the server's matcher, then sort, skip,
     * limit and projection. The index and the matcher compare {@code _id} the same way (values
     * normalized by {@code Utils.normalizeValue}, then {@code equals}), and a pinned {@code _id}
     * selects at most one document, so every result (matched, modified and upserted documents,
     * counts, returned documents) is the one a full scan gives. Only values whose equality the
     * two certainly agree on are looked up (see {@link #lookupValue}); any other filter, and a
     * collection without a unique {@code _id} index, take the stock path.
     *
     * <p>Not covered: aggregation stages (the library runs {@code $match} over a full scan). One
     * difference remains for invalid filters only: an operator the matcher rejects is reported
     * by a scan as soon as it meets any document, but here only when the pinned document exists.
     */
    static final class IdIndexCollection extends MemoryCollection {
        IdIndexCollection(MongoDatabase database, String collectionName, CollectionOptions options,
                          CursorRegistry cursorRegistry) {
            super(database, collectionName, options, cursorRegistry);
        }

        @Override
        protected QueryResult queryDocuments(Document query, Document orderBy, int numberToSkip,
                                             int limit, int batchSize, Document fieldSelector) {
            String idField = getIdField();
            Object id = idField == null ? null : pinnedId(query, idField);
            Index<Integer> idIndex = id == null ? null : idIndex(idField);
            if (idIndex != null) {
                Document idOnly = new Document(idField, id);
                if (idIndex.canHandle(idOnly)) {
                    return matchDocuments(query, idIndex.getPositions(idOnly), orderBy, numberToSkip,
                        limit, batchSize, fieldSelector);
                }
            }
            List<?> ids = idField == null ? null : pinnedIds(query, idField);
            Index<Integer> inIndex = ids == null ? null : idIndex(idField);
            if (inIndex != null) {
                java.util.TreeSet<Integer> positions = new java.util.TreeSet<>();
                for (Object value : ids) {
                    Document idOnly = new Document(idField, value);
                    if (!inIndex.canHandle(idOnly)) {
                        return super.queryDocuments(query, orderBy, numberToSkip, limit, batchSize,
                            fieldSelector);
                    }
                    for (Integer position : inIndex.getPositions(idOnly)) {
                        positions.add(position);
                    }
                }
                return matchDocuments(query, positions, orderBy, numberToSkip, limit, batchSize,
                    fieldSelector);
            }
            return super.queryDocuments(query, orderBy, numberToSkip, limit, batchSize, fieldSelector);
        }

        /**
         * The values of a top-level {@code {_id: {$in: [...]}}} whose every element is a value
         * {@link #lookupValue} would look up, or null. MongoDB serves such a filter from its
         * {@code _id} index too (counterd reads its ledger entries and the rows it cannot derive
         * this way, once per batch); the stock server scans the collection and tests every
         * document against the whole list. The positions are taken in ascending order (a scan's
         * order) without repeats, and the server's matcher applies the whole filter to them.
         */
        static List<?> pinnedIds(Document query, String idField) {
            Object condition = query.get(idField);
            if (!(condition instanceof Document)
                || !((Document) condition).keySet().equals(Set.of("$in"))) {
                return null;
            }
            Object values = ((Document) condition).get("$in");
            if (!(values instanceof List)) {
                return null;
            }
            for (Object value : (List<?>) values) {
                if (lookupValue(value) == null || value instanceof Document) {
                    return null;
                }
            }
            return (List<?>) values;
        }

        /** The collection's unique index on exactly {@code _id}, or null. */
        private Index<Integer> idIndex(String idField) {
            for (Index<Integer> index : getIndexes()) {
                if (index.isUnique() && index.getKeys().size() == 1
                    && index.getKeys().get(0).getKey().equals(idField)) {
                    return index;
                }
            }
            return null;
        }

        /**
         * The value {@code query} pins {@code _id} to: {@code {_id: v}} or {@code {_id: {$eq: v}}}
         * at the top level or in a clause of a (nested) {@code $and}; null if none. When the
         * filter pins it more than once, any one will do: the matcher checks all of them.
         */
        static Object pinnedId(Document query, String idField) {
            if (query.containsKey(idField)) {
                Object value = lookupValue(query.get(idField));
                if (value != null) {
                    return value;
                }
            }
            Object and = query.get("$and");
            if (and instanceof List) {
                for (Object clause : (List<?>) and) {
                    if (clause instanceof Document) {
                        Object value = pinnedId((Document) clause, idField);
                        if (value != null) {
                            return value;
                        }
                    }
                }
            }
            return null;
        }

        /**
         * The value a plain-equality condition compares {@code _id} with, or null when the
         * condition is anything else or its value is one the lookup might treat differently from
         * the matcher: null or missing (equality with null also matches a missing field), an
         * array (matched element-wise), a regular expression (a pattern match, not an equality),
         * or a document holding an operator or a {@code $}-field anywhere (DBRef-style and
         * operator semantics).
         */
        static Object lookupValue(Object condition) {
            Object value = condition;
            if (condition instanceof Document && ((Document) condition).keySet().equals(Set.of("$eq"))) {
                value = ((Document) condition).get("$eq");
            }
            return isPlainValue(value) ? value : null;
        }

        private static boolean isPlainValue(Object value) {
            if (value == null || value instanceof Missing || value instanceof Collection
                || BsonRegularExpression.isRegularExpression(value)) {
                return false;
            }
            if (value instanceof Document) {
                for (Map.Entry<String, Object> field : ((Document) value).entrySet()) {
                    if (field.getKey().startsWith("$") || !isPlainNested(field.getValue())) {
                        return false;
                    }
                }
            }
            return true;
        }

        private static boolean isPlainNested(Object value) {
            if (value instanceof Collection) {
                for (Object element : (Collection<?>) value) {
                    if (!isPlainNested(element)) {
                        return false;
                    }
                }
                return true;
            }
            return value == null || value instanceof Missing || isPlainValue(value);
        }
    }
}

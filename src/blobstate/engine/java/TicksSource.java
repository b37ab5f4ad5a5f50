/*
 * blobstate ticks: a streaming source with no rows whose offset the blobstate driver advances when the
 * query needs a batch without new input (timers, TTL, a watermark that moved), the way Spark's own
 * stateful operators ask for a no-data batch. It also reports each batch's blobstate metrics as its
 * source metrics, so they appear in the query's progress (lastProgress, listeners).
 *
 * Compiled and loaded with the placement helper (blobstate.engine.placement); not a Spark API.
 */
package org.apache.spark.sql.blobstate;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.util.Collections;
import java.util.HashMap;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.connector.read.streaming.ReportsSourceMetrics;
import org.apache.spark.sql.connector.read.streaming.SupportsAdmissionControl;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/** The ticks source: {@code spark.readStream.format(TicksSource.class.getName()).option("token", t)}. */
public final class TicksSource implements TableProvider {
  /** The option naming the query's tick channel (one per started query). */
  public static final String TOKEN = "token";

  static final StructType SCHEMA = new StructType().add("__blobstate_tick", DataTypes.LongType);

  private static final Map<String, Channel> CHANNELS = new ConcurrentHashMap<>();
  private static final ObjectMapper JSON = new ObjectMapper();

  /** What the driver of one query told its ticks source. */
  static final class Channel {
    final AtomicLong requested = new AtomicLong(0);
    volatile Map<String, String> metrics = Collections.emptyMap();
  }

  static Channel channel(String token) {
    return CHANNELS.computeIfAbsent(token, t -> new Channel());
  }

  /**
   * Ask for a batch: the source's offset becomes at least {@code offset}, so Spark sees new data at
   * its next trigger. Offsets only grow; the driver passes the next batch id.
   */
  public static void request(String token, long offset) {
    channel(token).requested.accumulateAndGet(offset, Math::max);
  }

  /** The metrics the source reports for the batch that just ran (keys and values in step). */
  public static void publish(String token, java.util.List<String> keys, java.util.List<String> values) {
    Map<String, String> metrics = new HashMap<>();
    for (int i = 0; i < keys.size(); i++) {
      metrics.put(keys.get(i), values.get(i));
    }
    channel(token).metrics = Collections.unmodifiableMap(metrics);
  }

  /**
   * {@link #publish} with the metrics as one JSON object of strings (one py4j call instead of one per
   * key and value).
   */
  public static void publishJson(String token, String metrics) throws IOException {
    Map<String, String> parsed = new HashMap<>();
    JsonNode object = JSON.readTree(metrics);
    if (object == null || !object.isObject()) {
      throw new IllegalArgumentException("blobstate ticks: the metrics are not a JSON object");
    }
    object.fields().forEachRemaining(e -> parsed.put(e.getKey(), e.getValue().asText()));
    channel(token).metrics = Collections.unmodifiableMap(parsed);
  }

  /** Forget a query's channel (when it stops). */
  public static void release(String token) {
    CHANNELS.remove(token);
  }

  public TicksSource() {}

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    return SCHEMA;
  }

  @Override
  public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
    String token = properties.get(TOKEN);
    if (token == null || token.isEmpty()) {
      throw new IllegalArgumentException("blobstate ticks source needs the option 'token'");
    }
    return new TicksTable(token);
  }

  static final class TicksTable implements Table, SupportsRead {
    private final String token;

    TicksTable(String token) {
      this.token = token;
    }

    @Override
    public String name() {
      return "blobstate";
    }

    @Override
    @SuppressWarnings("deprecation")
    public StructType schema() {
      return SCHEMA;
    }

    @Override
    public Set<TableCapability> capabilities() {
      return Collections.singleton(TableCapability.MICRO_BATCH_READ);
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
      return () -> new Scan() {
        @Override
        public StructType readSchema() {
          return SCHEMA;
        }

        @Override
        public String description() {
          return "blobstate";
        }

        @Override
        public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
          return new TicksStream(token);
        }
      };
    }
  }

  /** A tick offset: a number that only grows. */
  static final class TickOffset extends Offset {
    final long value;

    TickOffset(long value) {
      this.value = value;
    }

    @Override
    public String json() {
      return Long.toString(value);
    }
  }

  static final class TicksStream implements MicroBatchStream, SupportsAdmissionControl, ReportsSourceMetrics {
    private final String token;

    TicksStream(String token) {
      this.token = token;
    }

    @Override
    public Offset initialOffset() {
      return new TickOffset(0);
    }

    @Override
    public Offset latestOffset() {
      throw new UnsupportedOperationException("latestOffset(start, limit) is used");
    }

    /**
     * The requested offset. Before the driver requested anything on a source Spark has no offset of
     * yet (a new query), no offset at all: an offset there would be new data to Spark, and a new query
     * with no input would run an empty batch 0, which Spark's own stateful operators never run.
     */
    @Override
    public Offset latestOffset(Offset start, ReadLimit limit) {
      long from = start == null ? 0 : ((TickOffset) start).value;
      long requested = channel(token).requested.get();
      if (from == 0 && requested == 0) {
        return null;
      }
      return new TickOffset(Math.max(from, requested));
    }

    @Override
    public ReadLimit getDefaultReadLimit() {
      return ReadLimit.allAvailable();
    }

    @Override
    public Offset deserializeOffset(String json) {
      return new TickOffset(Long.parseLong(json.trim()));
    }

    @Override
    public InputPartition[] planInputPartitions(Offset start, Offset end) {
      return new InputPartition[0];
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
      return new NoRows();
    }

    @Override
    public Map<String, String> metrics(Optional<Offset> latestConsumedOffset) {
      return channel(token).metrics;
    }

    @Override
    public void commit(Offset end) {}

    @Override
    public void stop() {}

    @Override
    public String toString() {
      return "blobstate";
    }
  }

  static final class NoRows implements PartitionReaderFactory {
    private static final long serialVersionUID = 1L;

    @Override
    public PartitionReader<InternalRow> createReader(InputPartition partition) {
      throw new IllegalStateException("the blobstate ticks source has no partitions");
    }
  }
}

/*
 * blobstate metrics in Spark's metrics system: one source per query, named "blobstate.<query>" (its
 * queryName, else blobstate's query id), whose gauges hold the figures of the query's last committed
 * batch. Registered with the driver's MetricsSystem at the query's first batch, so every sink of
 * metrics.properties, JMX and the Prometheus servlet (/metrics/prometheus) carry them; removed when the
 * query stops.
 *
 * Compiled and loaded with the placement helper (blobstate.engine.placement); not a Spark API.
 */
package org.apache.spark.sql.blobstate;

import com.codahale.metrics.Gauge;
import com.codahale.metrics.MetricRegistry;
import com.fasterxml.jackson.core.json.JsonReadFeature;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.json.JsonMapper;
import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.spark.SparkEnv;
import org.apache.spark.metrics.source.Source;

public final class QueryMetrics implements Source {
  private static final Map<String, QueryMetrics> SOURCES = new ConcurrentHashMap<>();
  // Python's json writes an infinite gauge as Infinity.
  private static final ObjectMapper JSON =
      JsonMapper.builder().enable(JsonReadFeature.ALLOW_NON_NUMERIC_NUMBERS).build();

  private final String name;
  private final MetricRegistry registry = new MetricRegistry();
  private final Map<String, Double> values = new ConcurrentHashMap<>();

  private QueryMetrics(String name) {
    this.name = name;
  }

  @Override
  public String sourceName() {
    return name;
  }

  @Override
  public MetricRegistry metricRegistry() {
    return registry;
  }

  /**
   * Set the gauges of source {@code name} (keys and values in step), creating a gauge for each new key;
   * the source is registered with the driver's metrics system on its first update, with its gauges.
   */
  public static void update(String name, List<String> keys, List<Double> values) {
    QueryMetrics source = SOURCES.get(name);
    boolean created = source == null;
    if (created) {
      source = new QueryMetrics(name);
    }
    for (int i = 0; i < keys.size(); i++) {
      final String key = keys.get(i);
      final QueryMetrics owner = source;
      if (source.values.put(key, values.get(i)) == null) {
        source.registry.register(key, (Gauge<Double>) () -> owner.values.get(key));
      }
    }
    if (created) {
      SOURCES.put(name, source);
      SparkEnv env = SparkEnv.get();
      if (env != null) {
        env.metricsSystem().registerSource(source);
      }
    }
  }

  /**
   * {@link #update} with the gauges as one JSON object of numbers (one py4j call instead of one per
   * key and value).
   */
  public static void updateJson(String name, String gauges) throws IOException {
    JsonNode object = JSON.readTree(gauges);
    if (object == null || !object.isObject()) {
      throw new IllegalArgumentException("blobstate metrics: the gauges are not a JSON object");
    }
    List<String> keys = new ArrayList<>();
    List<Double> values = new ArrayList<>();
    object.fields().forEachRemaining(e -> {
      keys.add(e.getKey());
      values.add(e.getValue().asDouble());
    });
    update(name, keys, values);
  }

  /** Remove source {@code name} from the metrics system (its query stopped). */
  public static void remove(String name) {
    QueryMetrics source = SOURCES.remove(name);
    SparkEnv env = SparkEnv.get();
    if (source != null && env != null) {
      env.metricsSystem().removeSource(source);
    }
  }
}

/*
 * blobstate's Spark Connect server plugin: the JVM half of blobstate's seam for a Connect client.
 *
 * A Connect client has no JVM in its process; it sends blobstate's requests as relation extensions
 * (a google.protobuf.Any whose type URL is CALL_TYPE and whose value is a JSON object), and this plugin,
 * registered on the server with spark.connect.extensions.relation.classes, turns each into a logical
 * plan: either the wrapped child (preferred locations, partition groups, the committed-only view) or a
 * one-row relation whose single string column is the call's JSON answer. It calls the same entry
 * points as the classic client reaches through py4j.
 */
package org.apache.spark.sql.blobstate;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.Map;
import java.util.Optional;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;

import org.apache.spark.connect.proto.Relation;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.catalyst.plans.logical.EventTimeWatermark;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.streaming.StreamingRelationV2;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.connect.planner.SparkConnectPlanner;
import org.apache.spark.sql.connect.plugin.RelationPlugin;
import org.apache.spark.sql.execution.streaming.runtime.StreamingRelation;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;

import scala.jdk.javaapi.CollectionConverters;

/** Turns blobstate's relation extensions into logical plans (see the file comment). */
public final class ConnectPlugin implements RelationPlugin {
  /** The type URL of blobstate's requests. */
  public static final String CALL_TYPE = "type.googleapis.com/blobstate.Call";

  /** The column of a call's answer. */
  public static final String ANSWER_COLUMN = "answer";

  private static final ObjectMapper JSON = new ObjectMapper();

  /** How many wrapped plans are remembered (a few per batch are in use at a time). */
  private static final int WRAPPED_KEPT = 256;

  /**
   * The plans built for wrapping calls, by call id: a DataFrame sent again (persisted, then acted on)
   * must be the same plan over the same RDD, or Spark would compute it again instead of reading it.
   */
  private static final Map<String, LogicalPlan> WRAPPED =
      java.util.Collections.synchronizedMap(
          new java.util.LinkedHashMap<String, LogicalPlan>(16, 0.75f, true) {
            private static final long serialVersionUID = 1L;

            @Override
            protected boolean removeEldestEntry(Map.Entry<String, LogicalPlan> eldest) {
              return size() > WRAPPED_KEPT;
            }
          });

  public ConnectPlugin() {}

  @Override
  public Optional<LogicalPlan> transform(byte[] relation, SparkConnectPlanner planner) {
    AnyMessage any = AnyMessage.parse(relation);
    if (!CALL_TYPE.equals(any.typeUrl)) {
      return Optional.empty();
    }
    try {
      JsonNode call = JSON.readTree(new String(any.value, StandardCharsets.UTF_8));
      return Optional.of(answer(call, planner));
    } catch (java.io.IOException e) {
      throw new IllegalArgumentException("blobstate: malformed request: " + e.getMessage(), e);
    }
  }

  private static LogicalPlan answer(JsonNode call, SparkConnectPlanner planner) throws java.io.IOException {
    String op = call.path("op").asText();
    JsonNode args = call.path("args");
    String id = call.path("id").asText();
    boolean wrapping =
        op.equals("preferred_locations") || op.equals("partition_groups") || op.equals("committed_only");
    if (wrapping && WRAPPED.containsKey(id)) {
      return WRAPPED.get(id);
    }
    LogicalPlan built = build(op, args, call, planner);
    if (wrapping) {
      WRAPPED.put(id, built);
    }
    return built;
  }

  private static LogicalPlan build(String op, JsonNode args, JsonNode call, SparkConnectPlanner planner)
      throws java.io.IOException {
    SparkSession session = planner.session();
    List<Dataset<Row>> children = new ArrayList<>();
    for (JsonNode child : call.path("children")) {
      Relation proto = Relation.parseFrom(Base64.getDecoder().decode(child.asText()));
      children.add(Dataset.ofRows(session, planner.transformRelation(proto)));
    }
    switch (op) {
      case "preferred_locations":
        return PreferredLocations.withPreferredLocations(children.get(0), strings(args.path("locations")))
            .logicalPlan();
      case "partition_groups":
        return PreferredLocations.withPartitionGroups(
                children.get(0), groups(args.path("groups")), strings(args.path("locations")))
            .logicalPlan();
      case "committed_only":
        return CommittedOutputs.committedOnly(
                children.get(0),
                args.path("uid_column").asText(),
                args.path("meta_column").asText(),
                strings(args.path("uids")),
                args.path("what").asText())
            .logicalPlan();
      case "executors":
        {
          ArrayNode out = JSON.createArrayNode();
          for (String entry : PreferredLocations.blockManagers()) {
            out.add(entry);
          }
          return one(session, out);
        }
      case "ticks_request":
        TicksSource.request(args.path("token").asText(), args.path("offset").asLong());
        return one(session, JSON.nullNode());
      case "ticks_publish":
        TicksSource.publish(
            args.path("token").asText(),
            java.util.Arrays.asList(strings(args.path("keys"))),
            java.util.Arrays.asList(strings(args.path("values"))));
        return one(session, JSON.nullNode());
      case "ticks_release":
        TicksSource.release(args.path("token").asText());
        return one(session, JSON.nullNode());
      case "metrics_update":
        {
          List<Double> values = new ArrayList<>();
          for (JsonNode v : args.path("values")) {
            values.add(v.asDouble());
          }
          QueryMetrics.update(
              args.path("name").asText(), java.util.Arrays.asList(strings(args.path("names"))), values);
          return one(session, JSON.nullNode());
        }
      case "metrics_remove":
        QueryMetrics.remove(args.path("name").asText());
        return one(session, JSON.nullNode());
      case "watermarks":
        return one(session, watermarks(children.get(0).queryExecution().analyzed()));
      case "leaves":
        {
          ArrayNode out = JSON.createArrayNode();
          for (LogicalPlan leaf :
              CollectionConverters.asJava(children.get(0).queryExecution().analyzed().collectLeaves())) {
            out.add(leaf(leaf));
          }
          return one(session, out);
        }
      case "plain_source":
        return one(session, plainSource(children.get(0).queryExecution().analyzed()));
      case "is_local":
        return one(session, JSON.getNodeFactory().booleanNode(session.sparkContext().isLocal()));
      case "stage_resubmitted_at":
        {
          scala.Option<org.apache.spark.SparkStageInfo> info =
              session.sparkContext().statusTracker().getStageInfo(args.path("stage").asInt());
          if (info.isEmpty() || info.get().currentAttemptId() == 0) {
            return one(session, JSON.nullNode());
          }
          return one(session, JSON.getNodeFactory().numberNode(info.get().submissionTime()));
        }
      case "read_file":
        {
          org.apache.hadoop.fs.Path path = new org.apache.hadoop.fs.Path(args.path("uri").asText());
          org.apache.hadoop.fs.FileSystem fs = path.getFileSystem(session.sparkContext().hadoopConfiguration());
          try (java.io.InputStream in = fs.open(path)) {
            byte[] data = org.apache.commons.io.IOUtils.toByteArray(in);
            return one(session, JSON.getNodeFactory().textNode(Base64.getEncoder().encodeToString(data)));
          }
        }
      case "list_dir":
        {
          org.apache.hadoop.fs.Path path = new org.apache.hadoop.fs.Path(args.path("uri").asText());
          org.apache.hadoop.fs.FileSystem fs = path.getFileSystem(session.sparkContext().hadoopConfiguration());
          ArrayNode out = JSON.createArrayNode();
          if (fs.exists(path)) {
            for (org.apache.hadoop.fs.FileStatus status : fs.listStatus(path)) {
              out.add(status.getPath().getName());
            }
          }
          return one(session, out);
        }
      case "file_exists":
        {
          org.apache.hadoop.fs.Path path = new org.apache.hadoop.fs.Path(args.path("uri").asText());
          org.apache.hadoop.fs.FileSystem fs = path.getFileSystem(session.sparkContext().hadoopConfiguration());
          return one(session, JSON.getNodeFactory().booleanNode(fs.exists(path)));
        }
      case "ping":
        {
          ObjectNode out = JSON.createObjectNode();
          out.put("spark_version", org.apache.spark.package$.MODULE$.SPARK_VERSION());
          return one(session, out);
        }
      default:
        throw new IllegalArgumentException("blobstate: unknown request " + op + " (client and server plugin"
            + " of different blobstate versions?)");
    }
  }

  private static ArrayNode watermarks(LogicalPlan root) {
    ArrayNode out = JSON.createArrayNode();
    java.util.ArrayDeque<LogicalPlan> stack = new java.util.ArrayDeque<>();
    stack.push(root);
    while (!stack.isEmpty()) {
      LogicalPlan node = stack.pop();
      if (node instanceof EventTimeWatermark) {
        EventTimeWatermark w = (EventTimeWatermark) node;
        ObjectNode item = out.addObject();
        item.put("event_time", w.eventTime().name());
        item.put("delay", w.delay().toString());
        item.put("months", w.delay().months);
        item.put("days", w.delay().days);
        item.put("microseconds", w.delay().microseconds);
      }
      List<LogicalPlan> kids = new ArrayList<>(CollectionConverters.asJava(node.children()));
      java.util.Collections.reverse(kids);
      for (LogicalPlan kid : kids) {
        stack.push(kid);
      }
    }
    return out;
  }

  private static ObjectNode leaf(LogicalPlan node) {
    ObjectNode out = JSON.createObjectNode();
    String kind = node.getClass().getSimpleName();
    out.put("node", kind);
    if (node instanceof StreamingRelation) {
      org.apache.spark.sql.execution.datasources.DataSource source = ((StreamingRelation) node).dataSource();
      out.put("format", source.className());
      ObjectNode options = out.putObject("options");
      for (Map.Entry<String, String> e : CollectionConverters.asJava(source.options()).entrySet()) {
        options.put(e.getKey(), e.getValue());
      }
      if (source.userSpecifiedSchema().isDefined()) {
        out.put("schema_json", source.userSpecifiedSchema().get().json());
      }
    } else if (node instanceof StreamingRelationV2) {
      ObjectNode options = out.putObject("options");
      for (Map.Entry<String, String> e :
          ((StreamingRelationV2) node).extraOptions().asCaseSensitiveMap().entrySet()) {
        options.put(e.getKey(), e.getValue());
      }
    }
    return out;
  }

  private static JsonNode plainSource(LogicalPlan node) {
    while (true) {
      String kind = node.getClass().getSimpleName();
      if (kind.equals("Project")) {
        boolean plain = true;
        for (Object e :
            CollectionConverters.asJava(
                ((org.apache.spark.sql.catalyst.plans.logical.Project) node).projectList())) {
          plain &= e.getClass().getSimpleName().equals("AttributeReference");
        }
        if (!plain) {
          break;
        }
      } else if (!kind.equals("SubqueryAlias")) {
        break;
      }
      node = node.children().apply(0);
    }
    return node instanceof StreamingRelation ? leaf(node) : JSON.nullNode();
  }

  private static String[] strings(JsonNode array) {
    String[] out = new String[array.size()];
    for (int i = 0; i < out.length; i++) {
      JsonNode item = array.get(i);
      out[i] = item.isNull() ? null : item.asText();
    }
    return out;
  }

  /** Partition groups, a JSON array of arrays of partition indices, as withPartitionGroups takes them. */
  private static String[] groups(JsonNode array) {
    String[] out = new String[array.size()];
    for (int g = 0; g < out.length; g++) {
      StringBuilder group = new StringBuilder();
      for (JsonNode index : array.get(g)) {
        if (group.length() > 0) {
          group.append(',');
        }
        group.append(index.asText()); // withPartitionGroups names a malformed one
      }
      out[g] = group.toString();
    }
    return out;
  }

  private static LogicalPlan one(SparkSession session, JsonNode answer) throws java.io.IOException {
    StructType schema = new StructType().add(ANSWER_COLUMN, DataTypes.StringType, false);
    List<Row> rows = List.of(RowFactory.create(JSON.writeValueAsString(answer)));
    return session.createDataFrame(rows, schema).logicalPlan();
  }

  /** The two fields of a serialized google.protobuf.Any, read without a protobuf runtime. */
  static final class AnyMessage {
    final String typeUrl;
    final byte[] value;

    private AnyMessage(String typeUrl, byte[] value) {
      this.typeUrl = typeUrl;
      this.value = value;
    }

    static AnyMessage parse(byte[] bytes) {
      String typeUrl = "";
      byte[] value = new byte[0];
      int[] at = {0};
      while (at[0] < bytes.length) {
        long tag = varint(bytes, at);
        int field = (int) (tag >>> 3);
        int wire = (int) (tag & 7);
        if (wire != 2) {
          return new AnyMessage("", value); // not an Any of ours: only length-delimited fields there
        }
        int length = (int) varint(bytes, at);
        byte[] data = java.util.Arrays.copyOfRange(bytes, at[0], at[0] + length);
        at[0] += length;
        if (field == 1) {
          typeUrl = new String(data, StandardCharsets.UTF_8);
        } else if (field == 2) {
          value = data;
        }
      }
      return new AnyMessage(typeUrl, value);
    }

    private static long varint(byte[] bytes, int[] at) {
      long result = 0;
      int shift = 0;
      while (true) {
        byte b = bytes[at[0]++];
        result |= (long) (b & 0x7f) << shift;
        if ((b & 0x80) == 0) {
          return result;
        }
        shift += 7;
      }
    }
  }
}

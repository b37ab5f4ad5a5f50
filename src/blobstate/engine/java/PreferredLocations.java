/*
 * blobstate placement helper: per-partition preferred executor locations for one processing stage,
 * partition groups (several partitions read one after the other by one task), and the identity of
 * the executor each task runs on.
 *
 * Compiled by blobstate.engine.placement against the installed Spark jars and loaded at run time;
 * it is not part of any Spark API. It lives in a package under org.apache.spark.sql only so that it
 * can reach Spark internals that are private to that package in Scala (public in bytecode).
 */
package org.apache.spark.sql.blobstate;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Properties;

import org.apache.spark.Dependency;
import org.apache.spark.NarrowDependency;
import org.apache.spark.Partition;
import org.apache.spark.SparkEnv;
import org.apache.spark.TaskContext;
import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.plans.physical.Partitioning;
import org.apache.spark.sql.catalyst.plans.physical.UnknownPartitioning;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.execution.LogicalRDD;
import org.apache.spark.sql.execution.LogicalRDD$;
import org.apache.spark.sql.functions;
import org.apache.spark.storage.BlockManagerId;

import scala.collection.AbstractIterator;
import scala.collection.Iterator;
import scala.jdk.javaapi.CollectionConverters;
import scala.reflect.ClassTag;
import scala.reflect.ClassTag$;

/** Entry points called from Python through py4j. */
public final class PreferredLocations {
  /** Task-local property holding the executor id of the executor a task runs on. */
  public static final String EXECUTOR_ID_KEY = "blobstate.executor.id";
  /** Task-local property holding the block manager host of the executor a task runs on. */
  public static final String EXECUTOR_HOST_KEY = "blobstate.executor.host";

  private static final ClassTag<InternalRow> ROW_TAG = ClassTag$.MODULE$.apply(InternalRow.class);
  private static final ObjectMapper JSON = new ObjectMapper();

  private PreferredLocations() {}

  /**
   * A {@code String[]} of a JSON array of strings and nulls: the driver passes an array in one py4j
   * call instead of one call per element.
   */
  public static String[] stringArray(String json) throws IOException {
    JsonNode array = JSON.readTree(json);
    if (array == null || !array.isArray()) {
      throw new IllegalArgumentException("blobstate placement: not a JSON array of strings");
    }
    String[] out = new String[array.size()];
    for (int i = 0; i < out.length; i++) {
      JsonNode item = array.get(i);
      if (!item.isNull() && !item.isTextual()) {
        throw new IllegalArgumentException("blobstate placement: item " + i + " is not a string");
      }
      out[i] = item.isNull() ? null : item.textValue();
    }
    return out;
  }

  /**
   * {@code df} with column {@code partitionColumn} holding each row's state partition,
   * {@code pmod(hash(keys), n)}, and hash-partitioned by {@code keys} (a JSON array of column names)
   * into {@code n} partitions: what {@code df.withColumn(...).repartition(n, keys)} gives, in one
   * py4j call.
   */
  public static Dataset<Row> byStatePartition(
      Dataset<Row> df, String keys, String partitionColumn, int n) throws IOException {
    String[] names = stringArray(keys);
    Column[] columns = new Column[names.length];
    for (int i = 0; i < names.length; i++) {
      columns[i] = functions.col(names[i]);
    }
    return df.withColumn(partitionColumn, functions.pmod(functions.hash(columns), functions.lit(n)))
        .repartition(n, columns);
  }

  /**
   * The same rows in the same partitions as {@code df}, as a DataFrame whose scan is a narrow 1:1
   * wrapper of {@code df}'s RDD. Partition i prefers {@code locations[i]}: a TaskLocation string
   * such as {@code executor_<host>_<id>}, or several separated by commas (the partition's active
   * executor, then its standbys), of which the first executor alive when the stage is submitted
   * wins; null or empty means no preference. Because the choice is made per stage submission, a
   * stage resubmitted after an executor loss prefers the next candidate. Operators applied on
   * top (e.g. mapInArrow) run in the same stage and so inherit the preference. Every task of that
   * stage also gets the task-local properties {@link #EXECUTOR_ID_KEY} and {@link #EXECUTOR_HOST_KEY}.
   *
   * <p>Note: obtaining the RDD plans {@code df}; with adaptive execution, shuffle stages below it
   * run now.
   */
  public static Dataset<Row> withPreferredLocations(Dataset<Row> df, String[] locations) {
    RDD<InternalRow> parent = df.queryExecution().toRdd();
    int n = parent.getNumPartitions();
    if (locations.length != n) {
      throw new IllegalArgumentException(
          "blobstate placement: " + locations.length + " preferred locations given for a DataFrame with "
              + n + " partitions");
    }
    LocatedRDD located = new LocatedRDD(parent, locations.clone());
    // Like Dataset.checkpoint: keep the output attributes, partitioning and ordering of df.
    LogicalRDD plan = LogicalRDD$.MODULE$.fromDataset(located, df, df.isStreaming(), false);
    return Dataset.ofRows(df.sparkSession(), plan);
  }

  /**
   * The rows of {@code df} regrouped into {@code groups.length} partitions, as a DataFrame whose scan
   * is a narrow wrapper of {@code df}'s RDD (no shuffle, like {@code coalesce}): partition g holds
   * the partitions of {@code df} listed in {@code groups[g]} (comma-separated indices, such as
   * {@code "0,3,7"}), read one after the other in that order by one task. Every partition of
   * {@code df} is in exactly one group. Partition g prefers {@code locations[g]}, with the meaning
   * an entry of {@link #withPreferredLocations} has (one TaskLocation string, or several separated
   * by commas of which the first executor alive when the stage is submitted wins; null or empty
   * means no preference). Operators applied on top (e.g. mapInArrow) run in the same stage, one
   * task per group, and every task of that stage gets the task-local properties
   * {@link #EXECUTOR_ID_KEY} and {@link #EXECUTOR_HOST_KEY}.
   *
   * <p>The result keeps {@code df}'s output attributes and streaming flag but claims no output
   * partitioning or ordering: its partitions are no longer {@code df}'s.
   *
   * <p>Note: obtaining the RDD plans {@code df}; with adaptive execution, shuffle stages below it
   * run now.
   *
   * @throws IllegalArgumentException when {@code groups} and {@code locations} differ in length, a
   *     group is empty or names an index that is malformed or out of range, or a partition of
   *     {@code df} is in no group or in more than one
   */
  public static Dataset<Row> withPartitionGroups(Dataset<Row> df, String[] groups, String[] locations) {
    if (groups.length != locations.length) {
      throw new IllegalArgumentException(
          "blobstate placement: " + groups.length + " partition groups given with " + locations.length
              + " preferred locations");
    }
    RDD<InternalRow> parent = df.queryExecution().toRdd();
    int[][] members = partitionGroups(groups, parent.getNumPartitions());
    GroupedRDD grouped = new GroupedRDD(parent, members, locations.clone());
    return Dataset.ofRows(df.sparkSession(), unpartitionedPlan(grouped, df));
  }

  /**
   * The parent partition indices of each group in {@code groups}, checked: each of the {@code n}
   * parent partitions in exactly one group, no group empty.
   */
  private static int[][] partitionGroups(String[] groups, int n) {
    int[][] out = new int[groups.length][];
    int[] groupOf = new int[n];
    java.util.Arrays.fill(groupOf, -1);
    for (int g = 0; g < groups.length; g++) {
      String group = groups[g] == null ? "" : groups[g].trim();
      if (group.isEmpty()) {
        throw new IllegalArgumentException("blobstate placement: partition group " + g + " is empty");
      }
      String[] items = group.split(",", -1);
      out[g] = new int[items.length];
      for (int j = 0; j < items.length; j++) {
        int index;
        try {
          index = Integer.parseInt(items[j].trim());
        } catch (NumberFormatException e) {
          throw new IllegalArgumentException(
              "blobstate placement: partition group " + g + " has a malformed partition index '"
                  + items[j] + "'");
        }
        if (index < 0 || index >= n) {
          throw new IllegalArgumentException(
              "blobstate placement: partition group " + g + " names partition " + index
                  + ", out of range for a DataFrame with " + n + " partitions");
        }
        if (groupOf[index] >= 0) {
          throw new IllegalArgumentException(
              "blobstate placement: partition " + index + " is in partition group " + groupOf[index]
                  + (groupOf[index] == g ? " twice" : " and in partition group " + g));
        }
        groupOf[index] = g;
        out[g][j] = index;
      }
    }
    for (int index = 0; index < n; index++) {
      if (groupOf[index] < 0) {
        throw new IllegalArgumentException(
            "blobstate placement: partition " + index + " is in no partition group");
      }
    }
    return out;
  }

  /**
   * A plan scanning {@code rdd} with {@code df}'s output attributes and streaming flag, claiming
   * unknown partitioning (of {@code rdd}'s partition count) and no ordering.
   *
   * <p>{@code LogicalRDD}'s first parameter list starts (output, rdd, outputPartitioning,
   * outputOrdering, isStreaming), but its later parameters differ between Spark releases (in 4.3
   * the first list also has a stream, the second holds the session, statistics, constraints and a
   * checkpoint flag), so no one constructor call compiles against all of them. The node is built
   * by {@code fromDataset} instead (which takes {@code df}'s partitioning and ordering, statistics
   * and constraints) and copied with those two replaced: {@code makeCopy} calls the constructor of
   * the running Spark with the first list as given and the node's other copy arguments as they are.
   */
  static LogicalRDD unpartitionedPlan(RDD<InternalRow> rdd, Dataset<Row> df) {
    LogicalRDD like = LogicalRDD$.MODULE$.fromDataset(rdd, df, df.isStreaming(), false);
    List<Object> args = new ArrayList<>();
    Iterator<Object> fields = like.productIterator();
    while (fields.hasNext()) {
      args.add(fields.next());
    }
    int at = 0;
    while (at < args.size() && !(args.get(at) instanceof Partitioning)) {
      at++;
    }
    if (at + 1 >= args.size() || !(args.get(at + 1) instanceof scala.collection.Seq)) {
      throw new IllegalStateException(
          "blobstate placement: the LogicalRDD of Spark "
              + org.apache.spark.package$.MODULE$.SPARK_VERSION()
              + " has no outputPartitioning followed by outputOrdering");
    }
    args.set(at, new UnknownPartitioning(rdd.getNumPartitions()));
    args.set(at + 1, scala.collection.immutable.Nil$.MODULE$);
    return (LogicalRDD) like.makeCopy(args.toArray());
  }

  /**
   * Block managers known to the driver, as "executorId\thost" strings: every executor that is
   * registered, plus the driver (id "driver").
   */
  public static String[] blockManagers() {
    scala.collection.Iterator<BlockManagerId> ids =
        SparkEnv.get().blockManager().master().getMemoryStatus().keysIterator();
    List<String> out = new ArrayList<>();
    while (ids.hasNext()) {
      BlockManagerId id = ids.next();
      out.add(id.executorId() + "\t" + id.host());
    }
    Collections.sort(out);
    return out.toArray(new String[0]);
  }

  /** Records the identity of the executor running the current task in its local properties. */
  static void recordExecutorIdentity(TaskContext context) {
    SparkEnv env = SparkEnv.get();
    Properties props = context.getLocalProperties();
    props.setProperty(EXECUTOR_ID_KEY, env.executorId());
    props.setProperty(EXECUTOR_HOST_KEY, env.blockManager().blockManagerId().host());
  }

  /**
   * The preferred location of an entry of {@link #withPreferredLocations}' or
   * {@link #withPartitionGroups}' locations: none for null or empty, the entry itself when it names
   * one location, else the first of its comma-separated candidates whose executor is alive now
   * (none when none is).
   */
  static scala.collection.immutable.Seq<String> preferred(String location) {
    List<String> out = new ArrayList<>();
    if (location != null && !location.isEmpty()) {
      String[] candidates = location.split(",");
      String chosen = candidates.length == 1 ? candidates[0] : firstAlive(candidates);
      if (chosen != null) {
        out.add(chosen);
      }
    }
    return CollectionConverters.asScala(out).toList();
  }

  /** The first candidate whose executor (id and host) is registered now; null when none is. */
  private static String firstAlive(String[] candidates) {
    java.util.Set<String> alive = new java.util.HashSet<>();
    for (String entry : blockManagers()) {
      String[] parts = entry.split("\t", 2);
      alive.add("executor_" + parts[1] + "_" + parts[0]);
    }
    for (String candidate : candidates) {
      if (alive.contains(candidate)) {
        return candidate;
      }
    }
    return null;
  }

  /** Narrow 1:1 wrapper of an RDD with fixed preferred locations per partition. */
  static final class LocatedRDD extends RDD<InternalRow> {
    private static final long serialVersionUID = 1L;
    private final String[] locations;

    LocatedRDD(RDD<InternalRow> parent, String[] locations) {
      super(parent, ROW_TAG);
      this.locations = locations;
    }

    @Override
    public Partition[] getPartitions() {
      return firstParent(ROW_TAG).partitions();
    }

    @Override
    public scala.collection.immutable.Seq<String> getPreferredLocations(Partition split) {
      return preferred(locations[split.index()]);
    }

    @Override
    public Iterator<InternalRow> compute(Partition split, TaskContext context) {
      // Runs when the task starts pulling this RDD, which is before any Python runner above it
      // starts its worker and sends it the task's local properties.
      recordExecutorIdentity(context);
      return firstParent(ROW_TAG).iterator(split, context);
    }
  }

  /**
   * Narrow wrapper of an RDD whose partition g reads the parent partitions of group g, in order,
   * with a fixed preferred location per group (like Spark's CoalescedRDD, with given groups).
   */
  static final class GroupedRDD extends RDD<InternalRow> {
    private static final long serialVersionUID = 1L;
    private final int[][] groups;
    private final String[] locations;

    GroupedRDD(RDD<InternalRow> parent, int[][] groups, String[] locations) {
      super(parent.context(), dependencyOn(parent, groups), ROW_TAG);
      this.groups = groups;
      this.locations = locations;
    }

    private static scala.collection.immutable.Seq<Dependency<?>> dependencyOn(
        RDD<InternalRow> parent, int[][] groups) {
      List<Dependency<?>> out = new ArrayList<>();
      out.add(new GroupDependency(parent, groups));
      return CollectionConverters.asScala(out).toList();
    }

    @Override
    public Partition[] getPartitions() {
      Partition[] parents = firstParent(ROW_TAG).partitions();
      Partition[] out = new Partition[groups.length];
      for (int g = 0; g < groups.length; g++) {
        Partition[] members = new Partition[groups[g].length];
        for (int j = 0; j < members.length; j++) {
          members[j] = parents[groups[g][j]];
        }
        out[g] = new GroupPartition(g, members);
      }
      return out;
    }

    @Override
    public scala.collection.immutable.Seq<String> getPreferredLocations(Partition split) {
      return preferred(locations[split.index()]);
    }

    @Override
    public Iterator<InternalRow> compute(Partition split, TaskContext context) {
      // As in LocatedRDD: before any Python runner above starts its worker.
      recordExecutorIdentity(context);
      return new ConcatenatedPartitions(firstParent(ROW_TAG), ((GroupPartition) split).parents, context);
    }
  }

  /** Partition g of a GroupedRDD depends on the parent partitions of group g. */
  static final class GroupDependency extends NarrowDependency<InternalRow> {
    private static final long serialVersionUID = 1L;
    private final int[][] groups;

    GroupDependency(RDD<InternalRow> parent, int[][] groups) {
      super(parent);
      this.groups = groups;
    }

    @Override
    public scala.collection.immutable.Seq<Object> getParents(int partitionId) {
      List<Object> out = new ArrayList<>();
      for (int index : groups[partitionId]) {
        out.add(index);
      }
      return CollectionConverters.asScala(out).toList();
    }
  }

  /** A partition of a GroupedRDD: its index and the parent partitions it reads, in order. */
  static final class GroupPartition implements Partition {
    private static final long serialVersionUID = 1L;
    private final int index;
    final Partition[] parents;

    GroupPartition(int index, Partition[] parents) {
      this.index = index;
      this.parents = parents;
    }

    @Override
    public int index() {
      return index;
    }

    // What Partition's Scala defaults do; written out because their trait's accessor of Object's
    // equals is not implemented by a Java class.
    @Override
    public int hashCode() {
      return index;
    }

    @Override
    public boolean equals(Object other) {
      return this == other;
    }
  }

  /**
   * The rows of the given partitions of {@code parent}, one partition after the other. Lazy: a
   * partition's iterator is opened when the one before it is exhausted, and rows are handed on as
   * the parent's iterators give them (scans reuse row objects).
   */
  static final class ConcatenatedPartitions extends AbstractIterator<InternalRow> {
    private final RDD<InternalRow> parent;
    private final Partition[] partitions;
    private final TaskContext context;
    private int next;
    private Iterator<InternalRow> current;

    ConcatenatedPartitions(RDD<InternalRow> parent, Partition[] partitions, TaskContext context) {
      this.parent = parent;
      this.partitions = partitions;
      this.context = context;
    }

    @Override
    public boolean hasNext() {
      while (current == null || !current.hasNext()) {
        if (next >= partitions.length) {
          return false;
        }
        current = parent.iterator(partitions[next++], context);
      }
      return true;
    }

    @Override
    public InternalRow next() {
      if (!hasNext()) {
        throw new java.util.NoSuchElementException();
      }
      return current.next();
    }
  }
}

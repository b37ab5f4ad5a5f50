/*
 * blobstate placement helper: per-partition preferred executor locations for one processing stage,
 * and the identity of the executor each task runs on.
 *
 * Compiled by blobstate.engine.placement against the installed Spark jars and loaded at run time;
 * it is not part of any Spark API. It lives in a package under org.apache.spark.sql only so that it
 * can reach Spark internals that are private to that package in Scala (public in bytecode).
 */
package org.apache.spark.sql.blobstate;

import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Properties;

import org.apache.spark.Partition;
import org.apache.spark.SparkEnv;
import org.apache.spark.TaskContext;
import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.execution.LogicalRDD;
import org.apache.spark.sql.execution.LogicalRDD$;
import org.apache.spark.storage.BlockManagerId;

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

  private PreferredLocations() {}

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
      String location = locations[split.index()];
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

    @Override
    public Iterator<InternalRow> compute(Partition split, TaskContext context) {
      // Runs when the task starts pulling this RDD, which is before any Python runner above it
      // starts its worker and sends it the task's local properties.
      recordExecutorIdentity(context);
      return firstParent(ROW_TAG).iterator(split, context);
    }
  }
}

/*
 * blobstate's reads of Spark's checkpoint files through Hadoop's FileSystem, each in one py4j call
 * (the driver reads the batch's offset log entry every batch).
 *
 * Compiled and loaded with the placement helper (blobstate.engine.placement); not a Spark API.
 */
package org.apache.spark.sql.blobstate;

import java.io.IOException;
import java.io.InputStream;
import org.apache.commons.io.IOUtils;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

/** Entry point called from Python through py4j. */
public final class HadoopFiles {
  private HadoopFiles() {}

  /** The whole file at {@code uri}, through the FileSystem {@code conf} gives its scheme. */
  public static byte[] read(String uri, Configuration conf) throws IOException {
    Path path = new Path(uri);
    FileSystem fs = path.getFileSystem(conf);
    try (InputStream in = fs.open(path)) {
      return IOUtils.toByteArray(in);
    }
  }
}

/*
 * blobstate: the rows of a partition that a predicate keeps, for the processing stage's output views
 * (CommittedOutputs, WriteThrough). Not a Spark API.
 */
package org.apache.spark.sql.blobstate;

import java.util.function.Predicate;

import org.apache.spark.sql.catalyst.InternalRow;

import scala.collection.AbstractIterator;
import scala.collection.Iterator;

/**
 * The rows of {@code rows} that {@code keep} accepts, in order. No read-ahead: scans reuse row
 * objects, so a row is handed on before the next is read.
 */
final class FilteredRows extends AbstractIterator<InternalRow> {
  private final Iterator<InternalRow> rows;
  private final Predicate<InternalRow> keep;
  private InternalRow pending;

  FilteredRows(Iterator<InternalRow> rows, Predicate<InternalRow> keep) {
    this.rows = rows;
    this.keep = keep;
  }

  @Override
  public boolean hasNext() {
    while (pending == null && rows.hasNext()) {
      InternalRow row = rows.next();
      if (keep.test(row)) {
        pending = row;
      }
    }
    return pending != null;
  }

  @Override
  public InternalRow next() {
    if (!hasNext()) {
      throw new java.util.NoSuchElementException();
    }
    InternalRow out = pending;
    pending = null;
    return out;
  }
}

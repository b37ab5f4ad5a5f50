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
 * The rows of {@code rows} that {@code keep} accepts, in order; {@code atEnd} runs once, when
 * {@code rows} is found exhausted (in {@code hasNext}). No read-ahead: scans reuse row objects, so
 * a row is handed on before the next is read.
 */
final class FilteredRows extends AbstractIterator<InternalRow> {
  private final Iterator<InternalRow> rows;
  private final Predicate<InternalRow> keep;
  private final Runnable atEnd;
  private InternalRow pending;
  private boolean ended;

  FilteredRows(Iterator<InternalRow> rows, Predicate<InternalRow> keep) {
    this(rows, keep, () -> {});
  }

  FilteredRows(Iterator<InternalRow> rows, Predicate<InternalRow> keep, Runnable atEnd) {
    this.rows = rows;
    this.keep = keep;
    this.atEnd = atEnd;
  }

  @Override
  public boolean hasNext() {
    while (pending == null && rows.hasNext()) {
      InternalRow row = rows.next();
      if (keep.test(row)) {
        pending = row;
      }
    }
    if (pending == null && !ended) {
      ended = true;
      atEnd.run();
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

// The hand-written Kotlin layer over the generated bindings
// (uniffi.melddb_ffi): lambdas for transaction bodies, the change feed as
// a Flow, ranges as Sequences, and String keys and values in UTF-8. The
// generated objects are AutoCloseable (`use { }` frees native memory at
// once); async exports are `suspend` functions.
package dev.melddb

import kotlinx.coroutines.channels.awaitClose
import kotlinx.coroutines.channels.trySendBlocking
import kotlinx.coroutines.flow.Flow
import kotlinx.coroutines.flow.callbackFlow
import uniffi.melddb_ffi.ChangeListener
import uniffi.melddb_ffi.Commit
import uniffi.melddb_ffi.CommitOutcome
import uniffi.melddb_ffi.Database
import uniffi.melddb_ffi.Isolation
import uniffi.melddb_ffi.KeyValue
import uniffi.melddb_ffi.MeldException
import uniffi.melddb_ffi.RangeIterator
import uniffi.melddb_ffi.Transaction
import uniffi.melddb_ffi.TransactionBody
import java.util.concurrent.atomic.AtomicReference

/**
 * Runs [block] in a transaction and commits it, running it again on a
 * newer state when meld aborts it. Anything [block] throws (an `Error`
 * too) ends it with nothing committed and is rethrown here as it was.
 * Throws [MeldException.Aborted] when the retries run out.
 */
suspend fun Database.transact(
    isolation: Isolation = Isolation.SERIALIZABLE,
    block: (Transaction) -> Unit,
): CommitOutcome {
    // The generated callback layer passes on only Exceptions; every
    // Throwable is caught here, kept, and reported as a Callback error so
    // that the native side commits nothing.
    val thrown = AtomicReference<Throwable?>(null)
    val body =
        object : TransactionBody {
            override fun run(tx: Transaction) {
                try {
                    block(tx)
                } catch (t: Throwable) {
                    thrown.set(t)
                    throw MeldException.Callback(t.toString())
                }
            }
        }
    try {
        return transact(isolation, body)
    } catch (e: MeldException.Callback) {
        throw thrown.get() ?: e
    }
}

/**
 * The committed changes under [prefix], one [Commit] per transaction, in
 * log order, from the moment of collection. Cancelling the collector stops
 * the watch; a feed that ends (a collector that fell more than the node's
 * feed queue behind, or the node closed) ends the flow with that
 * [MeldException]. The flow buffers 64 commits; past them the watch waits
 * for the collector.
 */
fun Database.changes(prefix: ByteArray): Flow<Commit> =
    callbackFlow {
        val handle =
            watch(
                prefix,
                object : ChangeListener {
                    override fun onCommit(commit: Commit) {
                        trySendBlocking(commit)
                    }

                    override fun onEnd(error: MeldException) {
                        close(error)
                    }
                },
            )
        awaitClose {
            handle.stop()
            handle.close()
        }
    }

/** The pairs of a range, fetched lazily; iterate it once. */
fun RangeIterator.asSequence(): Sequence<KeyValue> = generateSequence { next() }

/** A key or value as UTF-8 bytes. */
val String.utf8: ByteArray get() = encodeToByteArray()

/** Reads [key] as UTF-8 text. */
fun Transaction.getString(key: String): String? = get(key.utf8)?.decodeToString()

/** Stores UTF-8 [value] under UTF-8 [key]. */
fun Transaction.put(key: String, value: String) = put(key.utf8, value.utf8)

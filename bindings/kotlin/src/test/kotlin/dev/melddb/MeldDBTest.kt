package dev.melddb

import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.async
import kotlinx.coroutines.awaitAll
import kotlinx.coroutines.flow.take
import kotlinx.coroutines.flow.toList
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withTimeout
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import org.junit.jupiter.api.assertThrows
import org.junit.jupiter.api.io.TempDir
import uniffi.melddb_ffi.CommitOutcome
import uniffi.melddb_ffi.Database
import uniffi.melddb_ffi.Isolation
import uniffi.melddb_ffi.MeldException
import java.nio.file.Path
import kotlin.random.Random

class MeldDBTest {
    @TempDir
    lateinit var dir: Path

    private fun open(name: String = "db") = Database.open(dir.resolve(name).toString())

    @Test
    fun `a closed economy on one node from many coroutines conserves its total`() = runBlocking {
        open().use { db ->
            val accounts = 10
            db.transact { tx -> for (i in 0 until accounts) tx.put("acct/$i", "1000") }
            val committed =
                (0 until 4).map { worker ->
                    async(Dispatchers.Default) {
                        val rng = Random(worker)
                        var n = 0
                        repeat(40) {
                            val from = "acct/${rng.nextInt(accounts)}"
                            val to = "acct/${rng.nextInt(accounts)}"
                            val amount = 1 + rng.nextInt(20)
                            val out =
                                db.transact { tx ->
                                    val a = tx.getString(from)!!.toInt()
                                    tx.put(from, (a - amount).toString())
                                    val b = tx.getString(to)!!.toInt()
                                    tx.put(to, (b + amount).toString())
                                }
                            if (out is CommitOutcome.Committed) n++
                        }
                        n
                    }
                }.awaitAll()
            assertEquals(160, committed.sum())
            db.beginRead().use { read ->
                val total = read.prefix("acct/".utf8).asSequence().sumOf { it.value.decodeToString().toInt() }
                assertEquals(accounts * 1000, total)
                assertTrue(read.position() > 160uL)
            }
        }
    }

    @Test
    fun `the change feed is a Flow of commits under the prefix, in log order`() = runBlocking {
        open().use { db ->
            val got =
                async {
                    withTimeout(10_000) { db.changes("user/".utf8).take(2).toList() }
                }
            // Let the collector start watching before committing.
            kotlinx.coroutines.delay(200)
            db.transact { tx -> tx.put("user/ann", "1") }
            db.transact { tx -> tx.put("other", "x") }
            db.transact { tx -> tx.put("user/bo", "2") }
            val commits = got.await()
            assertEquals(listOf("user/ann", "user/bo"), commits.map { it.changes.single().key.decodeToString() })
            assertTrue(commits[0].position < commits[1].position)
        }
    }

    @Test
    fun `errors are exceptions per case`() = runBlocking {
        val db = open()
        val tx = db.begin(Isolation.SERIALIZABLE)
        assertThrows<MeldException.Argument> { tx.put(ByteArray(5000), "v".utf8) }
        // A body that throws commits nothing; what it threw comes back as it
        // was, an Error as well as an Exception.
        val e = assertThrows<IllegalStateException> {
            runBlocking { db.transact { t -> t.put("k", "v"); throw IllegalStateException("changed my mind") } }
        }
        assertEquals("changed my mind", e.message)
        assertThrows<NotImplementedError> { runBlocking { db.transact { t -> t.put("k", "v"); TODO() } } }
        assertEquals(null, db.get("k".utf8))
        assertThrows<MeldException.Storage> { Database.open(dir.resolve("db").toString()) }
        db.shutdown()
        assertThrows<MeldException.State> { db.get("k".utf8) }
        db.close()
    }
}

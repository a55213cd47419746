/*
 * bench_ring's C++ peers: boost::lockfree::spsc_queue (single items and its bulk push/pop of 32),
 * moodycamel::ReaderWriterQueue (try_enqueue/try_dequeue) and moodycamel::BlockingReaderWriterCircularBuffer
 * (wait_enqueue/wait_dequeue, semaphores on both sides: the peer of mbpipe's blocking forms). Each is wrapped
 * in the push/pop shape of bench_ring.h and run by the same loops as mbpipe.
 */
#include <boost/lockfree/spsc_queue.hpp>
#include <readerwriterqueue/readerwritercircularbuffer.h>
#include <readerwriterqueue/readerwriterqueue.h>

#include "bench_ring.h"

namespace
{

using boost_q = boost::lockfree::spsc_queue<void *>;
using rwq_q = moodycamel::ReaderWriterQueue<void *>;
using rwcb_q = moodycamel::BlockingReaderWriterCircularBuffer<void *>;

template <class Q> void *create(unsigned capacity)
{
	return new Q(capacity);
}

template <class Q> void destroy(void *q)
{
	delete static_cast<Q *>(q);
}

/* boost: push/pop of one item, and the bulk forms, which move what fits and return the count */
unsigned boost_push(void *q, void *const *items, unsigned n)
{
	return n == 1 ? static_cast<boost_q *>(q)->push(items[0])
		      : static_cast<unsigned>(static_cast<boost_q *>(q)->push(items, n));
}

unsigned boost_pop(void *q, void **items, unsigned n)
{
	return n == 1 ? static_cast<boost_q *>(q)->pop(items[0])
		      : static_cast<unsigned>(static_cast<boost_q *>(q)->pop(items, n));
}

/* ReaderWriterQueue: try_enqueue never allocates (enqueue would grow the queue) */
unsigned rwq_push(void *q, void *const *items, unsigned)
{
	return static_cast<rwq_q *>(q)->try_enqueue(items[0]);
}

unsigned rwq_pop(void *q, void **items, unsigned)
{
	return static_cast<rwq_q *>(q)->try_dequeue(items[0]);
}

/* BlockingReaderWriterCircularBuffer: both sides block on a semaphore; never fail */
unsigned rwcb_push(void *q, void *const *items, unsigned)
{
	static_cast<rwcb_q *>(q)->wait_enqueue(items[0]);
	return 1;
}

unsigned rwcb_pop(void *q, void **items, unsigned)
{
	static_cast<rwcb_q *>(q)->wait_dequeue(items[0]);
	return 1;
}

BENCH_LOOPS(boost1, 1, boost_push, boost_pop)
BENCH_LOOPS(boost32, 32, boost_push, boost_pop)
BENCH_LOOPS(rwq, 1, rwq_push, rwq_pop)
BENCH_LOOPS(rwcb, 1, rwcb_push, rwcb_pop)

} // namespace

extern "C" {

const struct bench_impl bench_boost = {"boost",
				       "boost::lockfree::spsc_queue push/pop",
				       1,
				       false,
				       create<boost_q>,
				       destroy<boost_q>,
				       boost1_produce,
				       boost1_consume,
				       boost1_lead,
				       boost1_echo};
const struct bench_impl bench_boost_b32 = {"boost-b32",
					   "boost::lockfree::spsc_queue bulk push/pop of 32",
					   32,
					   false,
					   create<boost_q>,
					   destroy<boost_q>,
					   boost32_produce,
					   boost32_consume,
					   nullptr,
					   nullptr};
const struct bench_impl bench_rwq = {"rwq",
				     "moodycamel::ReaderWriterQueue try_enqueue/try_dequeue",
				     1,
				     false,
				     create<rwq_q>,
				     destroy<rwq_q>,
				     rwq_produce,
				     rwq_consume,
				     rwq_lead,
				     rwq_echo};
const struct bench_impl bench_rwcb_wait = {
    "rwcb-wait",
    "moodycamel::BlockingReaderWriterCircularBuffer wait_enqueue/wait_dequeue",
    1,
    true,
    create<rwcb_q>,
    destroy<rwcb_q>,
    rwcb_produce,
    rwcb_consume,
    rwcb_lead,
    rwcb_echo};
}

/*
 * mbp_dataset: labelled images from IDX files (MNIST, Fashion-MNIST), and the helpers a training loop needs
 * around them: a held-out validation split, a seeded order per epoch, and gathering a batch as floats.
 *
 * Not for direct inclusion: include <mbpipe.h>.
 *
 * Usage (error handling shortened):
 *
 *     mbp_dataset train, test;
 *     mbp_data_error e;
 *     if (mbp_fashion_mnist_load(&train, NULL, true, &e) < 0)    // NULL: MBP_FASHION_MNIST_DIR
 *             fprintf(stderr, "%s\n", e.msg);                    // names the file and what is wrong
 *     uint32_t *tr = malloc(...), *va = malloc(...), *order = malloc(...);
 *     mbp_data_split(train.n, 5000, seed, tr, va);               // 55,000 to train, 5,000 held out
 *     mbp_data_epoch_order(tr, train.n - 5000, seed, epoch, order);
 *     mbp_dataset_gather(&train, order + k, 256, x, y);          // 256 rows of 784 floats in [0, 1]
 *     mbp_dataset_free(&train);
 *
 * The IDX format (http://yann.lecun.com/exdb/mnist/): a 4-byte magic 0x00 0x00 <type> <dims>, then <dims>
 * big-endian 32-bit sizes, then the values. Images are type 0x08 (unsigned byte) with 3 dimensions
 * (count, rows, columns); labels type 0x08 with 1 dimension (count). Files are read through zlib's gzread,
 * so gzip-compressed (.gz) and plain files are both accepted. Everything is checked: the magic, the type,
 * the number of dimensions, non-zero sizes within bounds, the same count in both files, the exact data
 * length (a truncated file and trailing bytes are both errors), the gzip stream's integrity, and every
 * label below the class count. Each failure is a negative errno with a one-line message naming the file.
 *
 * Pixels stay bytes in memory (47 MB for Fashion-MNIST's training set) and become floats in [0, 1]
 * (value / 255) when gathered.
 *
 * Thread safety: loading and freeing a data set are one thread's; the other calls only read the data set
 * and write their own outputs, so any threads may call them at once on one loaded data set.
 */
#ifndef MBPIPE_DATA_H
#define MBPIPE_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Where Debian's dataset-fashion-mnist package puts the files. */
#define MBP_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"

/** What went wrong in a load: filled on error (zeroed on success). */
typedef struct mbp_data_error {
	int code;      /**< the negative errno returned */
	char msg[480]; /**< one line: "<file>: <what is wrong>" */
} mbp_data_error;

/** A loaded data set. A zeroed struct is an empty one (mbp_dataset_free accepts it). */
typedef struct mbp_dataset {
	uint32_t n;	  /**< images (and labels) */
	uint32_t rows;	  /**< pixel rows per image */
	uint32_t cols;	  /**< pixel columns per image */
	uint32_t width;	  /**< rows x cols: floats per gathered row */
	uint32_t classes; /**< labels are in [0, classes) */
	uint8_t *pixels;  /**< n x width bytes */
	int32_t *labels;  /**< n */
} mbp_dataset;

/**
 * Load an image file and its label file. Pair with mbp_dataset_free().
 *
 * @param ds      receives the data set (zeroed on error)
 * @param images  IDX file of images (gzip or plain)
 * @param labels  IDX file of labels (gzip or plain)
 * @param classes number of classes (1 .. 65536): a label at or above it is an error
 * @param err     optional: the error and its message
 * @return 0; -EINVAL (NULL, classes out of range); the system's -errno when a file cannot be opened or
 *         read (-ENOENT ...); -EBADMSG (bad magic, type or dimension count, a corrupt gzip stream, a
 *         truncated file, trailing bytes); -EPROTO (a zero size, or the two files' counts differ); -E2BIG
 *         (sizes above 2^28 images or 2^16 pixels a side); -ERANGE (a label out of range, naming its
 *         index); -ENOMEM.
 */
int mbp_idx_load(mbp_dataset *ds, const char *images, const char *labels, uint32_t classes,
		 mbp_data_error *err);

/**
 * Load Fashion-MNIST's training set (60,000 images) or test set (10,000) from a folder holding
 * {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz, with 10 classes. Pair with mbp_dataset_free().
 * @param dir the folder; NULL: MBP_FASHION_MNIST_DIR
 * @return as mbp_idx_load (-EINVAL also for a folder name above 450 bytes).
 */
int mbp_fashion_mnist_load(mbp_dataset *ds, const char *dir, bool train, mbp_data_error *err);

/** Free a data set's arrays and zero it. Accepts NULL and zeroed data sets. */
void mbp_dataset_free(mbp_dataset *ds);

/**
 * Copy `count` rows, by index, as floats in [0, 1] (count x width) and their labels.
 * @param idx row indices, each < ds->n
 * @param x   count x width floats
 * @param y   optional: count labels
 * @return 0, -EINVAL (NULL), -ERANGE (an index out of range; nothing written past the rows before it).
 */
int mbp_dataset_gather(const mbp_dataset *ds, const uint32_t *idx, uint32_t count, float *x, int32_t *y);

/**
 * Split rows 0 .. n-1 into a training part and a held-out validation part, at random from a seed (the same
 * seed, the same split): a seeded permutation whose first n - n_val entries, sorted, go to train and
 * the rest, sorted, to val.
 * @param train receives n - n_val indices
 * @param val   receives n_val indices (may be NULL when n_val is 0)
 * @return 0, -EINVAL (NULL, n_val > n), -ENOMEM.
 */
int mbp_data_split(uint32_t n, uint32_t n_val, uint64_t seed, uint32_t *train, uint32_t *val);

/**
 * The order of an epoch: a permutation of base[0 .. n-1] determined by (seed, epoch) alone, so a run
 * resumed at an epoch sees the same order (Fisher-Yates with a splitmix64 generator).
 * @param out n indices; may not overlap base
 * @return 0, -EINVAL.
 */
int mbp_data_epoch_order(const uint32_t *base, uint32_t n, uint64_t seed, uint64_t epoch, uint32_t *out);

#ifdef __cplusplus
}
#endif
#endif

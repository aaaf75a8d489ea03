"""A small tf.keras classifier with planted bugs (see the `# planted:` markers).

The same loss and mode contracts as the PyTorch examples, in Keras: `torchls check examples/`
reports them without TensorFlow installed (the analysis only reads the code).
"""

import numpy as np
import tensorflow as tf
from tensorflow.keras import layers

NUM_CLASSES = 10


def build_model() -> tf.keras.Model:
    inputs = tf.keras.Input(shape=(28, 28))
    x = layers.Flatten()(inputs)
    x = layers.Dense(256, activation="relu")(x)
    x = layers.Dropout(0.3)(x)
    logits = layers.Dense(NUM_CLASSES)(x)
    return tf.keras.Model(inputs=inputs, outputs=logits)


model = build_model()
optimizer = tf.keras.optimizers.Adam(1e-3)


def train_step(images, labels):
    with tf.GradientTape() as tape:
        logits = model(images)  # planted: TL604
        per_example = tf.keras.losses.sparse_categorical_crossentropy(
            labels, logits, from_logits=True
        )
        loss = tf.constant(np.mean(per_example.numpy()))  # planted: TL603
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    return loss


def evaluate(images, labels) -> float:
    logits = model(images, training=False)
    predicted = np.argmax(logits.numpy(), axis=1)
    return float(np.mean(predicted == labels))


def main() -> None:
    (x_train, y_train), (x_test, y_test) = tf.keras.datasets.mnist.load_data()
    x_train, x_test = x_train / 255.0, x_test / 255.0
    dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(10_000).batch(64)
    for epoch in range(3):
        for images, labels in dataset:
            loss = train_step(images, labels)
        print(f"epoch {epoch}: loss {float(loss):.3f}, accuracy {evaluate(x_test, y_test):.3f}")

    # A second run through compile/fit for comparison.
    baseline = build_model()
    baseline.compile(
        optimizer="adam",
        loss="sparse_categorical_crossentropy",  # planted: TL602
        metrics=["accuracy"],
        run_eagerly=True,  # planted: TL605
    )
    baseline.fit(x_train, y_train, epochs=3, validation_data=(x_test, y_test))


if __name__ == "__main__":
    main()

//! A message in CloudEvents binary content mode as a protocol binding reads it, for the
//! CloudEvents SDK's binary-mode deserializer: attributes and extensions in headers under the
//! binding's prefix (`ce_` on Kafka, `cloudEvents:` on AMQP), the content type in the
//! binding's header if it has one, the body as data.

use cloudevents::event::SpecVersion;
use cloudevents::message::{
    BinaryDeserializer, BinarySerializer, Error as SdkError, MessageAttributeValue,
};
use entrega_core::Headers;

/// One message under one binding's names.
pub struct BindingMessage<'a> {
    /// The attributes' header prefix.
    pub prefix: &'static str,
    /// The header holding `datacontenttype`, if the binding keeps it apart.
    pub content_type: Option<&'static str>,
    /// The message's headers.
    pub headers: &'a Headers,
    /// Its body.
    pub body: Vec<u8>,
}

impl BinaryDeserializer for BindingMessage<'_> {
    fn deserialize_binary<R: Sized, V: BinarySerializer<R>>(
        self,
        serializer: V,
    ) -> cloudevents::message::Result<R> {
        let spec = self
            .headers
            .get(&format!("{}specversion", self.prefix))
            .ok_or(SdkError::WrongEncoding {})?;
        let spec = SpecVersion::try_from(spec)?;
        let attributes = spec.attribute_names();
        let mut serializer = serializer.set_spec_version(spec.clone())?;
        if let Some(content_type) = self.content_type.and_then(|h| self.headers.get(h)) {
            serializer = serializer.set_attribute(
                "datacontenttype",
                MessageAttributeValue::String(content_type.to_owned()),
            )?;
        }
        for (name, value) in self.headers.iter() {
            let Some(attribute) = name.strip_prefix(self.prefix) else {
                continue;
            };
            if attribute == "specversion" {
                continue;
            }
            let value = MessageAttributeValue::String(value.to_owned());
            serializer = if attributes.contains(&attribute) {
                serializer.set_attribute(attribute, value)?
            } else {
                serializer.set_extension(attribute, value)?
            };
        }
        serializer.end_with_data(self.body)
    }
}
